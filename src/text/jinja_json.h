// Python's json.dumps over template values: transformers replaces jinja2's tojson filter with
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False), and tool schemas in
// chat prompts are rendered with it, so the bytes (", " and ": " separators, float repr) must match.
#pragma once

#include <optional>
#include <string>

#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

struct JsonDumpOptions {
  std::optional<std::string> indent;   // json.dumps' indent as the string prepended per level; none: one line
  bool ensure_ascii = false;           // escape non-ASCII as \uXXXX (surrogate pairs above the BMP)
  std::optional<std::string> item_separator;  // default ", " (or "," when indenting)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
};

// Fails (EvalFailure) on values JSON has no form for (Undefined, namespaces, functions), as json.dumps does.
std::string json_dumps(const Value& v, const JsonDumpOptions& options);

}  // namespace hybridflow::text::jinja
