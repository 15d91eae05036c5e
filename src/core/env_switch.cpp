#include "hybridflow/core/env_switch.h"

#include <cstdlib>
#include <string>

#include "hybridflow/core/error.h"

namespace hybridflow {

bool env_switch(const char* name, bool unset, const char* what) {
  const char* v = std::getenv(name);
  const std::string s = v == nullptr ? "" : v;
  if (s.empty()) return unset;
  if (s == "on" || s == "1") return true;
  if (s == "off" || s == "0") return false;
  HF_FAIL(name, ": expected on or off (", what, "), got '", s, "'");
}

}  // namespace hybridflow
