// Small helpers shared by the benchmarks: wall-clock timing and argument parsing.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "hybridflow/core/steady_seconds.h"

namespace hybridflow::bench {

inline double now_seconds() { return steady_seconds(); }

// "--name=value" from argv, else the fallback.
inline std::string arg(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0) return argv[i] + prefix.size();
  }
  return fallback;
}

inline long long arg_int(int argc, char** argv, const std::string& name, long long fallback) {
  return std::atoll(arg(argc, argv, name, std::to_string(fallback)).c_str());
}

}  // namespace hybridflow::bench
