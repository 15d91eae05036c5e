// Tool-call parsing (see the header for the formats). Both formats share the per-call checks in
// tool_call_from_json; they differ only in how calls are delimited in the text.
#include "hybridflow/text/tool_calls.h"

#include <string>
#include <vector>

#include "hybridflow/core/error.h"

namespace hybridflow::text {
namespace {

constexpr std::string_view kToolCallOpenTag = "<tool_call>";
constexpr std::string_view kToolCallCloseTag = "</tool_call>";
constexpr std::string_view kLlamaPythonTag = "<|python_tag|>";
// Deeper arguments are rejected before nlohmann-json sees them: its dump() recurses per level.
constexpr int kToolCallMaxNesting = 64;

bool is_tool_call_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t skip_tool_call_space(std::string_view text, size_t pos) {
  while (pos < text.size() && is_tool_call_space(text[pos])) ++pos;
  return pos;
}

std::string_view trim_tool_call_space(std::string_view s) {
  const size_t begin = skip_tool_call_space(s, 0);
  size_t end = s.size();
  while (end > begin && is_tool_call_space(s[end - 1])) --end;
  return s.substr(begin, end - begin);
}

// Brackets are counted outside JSON strings only; kinds are not matched here (the JSON parser does).
struct JsonScan {
  size_t end = std::string_view::npos;  // one past the bracket closing the value at `begin`, if found
  bool too_deep = false;
};

JsonScan scan_tool_call_json(std::string_view text, size_t begin) {
  JsonScan scan;
  int depth = 0;
  bool in_string = false;
  for (size_t i = begin; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kToolCallMaxNesting) {
        scan.too_deep = true;
        return scan;
      }
    } else if ((c == '}' || c == ']') && --depth == 0) {
      scan.end = i + 1;
      return scan;
    }
  }
  return scan;
}

const char* json_type_name(const nlohmann::ordered_json& j) {
  return j.is_null() ? "null" : j.type_name();
}

// nlohmann's message without its "[json.exception.parse_error.101] " prefix.
std::string tool_call_parse_problem(const nlohmann::json::exception& e) {
  std::string what = e.what();
  const size_t bracket = what.find("] ");
  return what.rfind("[json.exception", 0) == 0 && bracket != std::string::npos ? what.substr(bracket + 2) : what;
}

// Fills `call` from one call's JSON text; returns "" or what is wrong with it. `arguments_keys` are
// the keys the arguments may be under, the preferred (and named in errors) first.
std::string tool_call_from_json(std::string_view json_text, const std::vector<std::string>& arguments_keys,
                                ToolCall& call) {
  if (scan_tool_call_json(json_text, 0).too_deep)
    return "the call's JSON is nested deeper than " + std::to_string(kToolCallMaxNesting) + " levels";
  nlohmann::ordered_json j;
  try {
    j = nlohmann::ordered_json::parse(json_text);
  } catch (const nlohmann::json::exception& e) {
    return "invalid JSON: " + tool_call_parse_problem(e);
  }
  if (!j.is_object()) return std::string("expected a JSON object {\"name\": ..., \"") + arguments_keys[0] +
                             "\": {...}}, got " + json_type_name(j);
  const auto name = j.find("name");
  if (name == j.end()) return "missing \"name\"";
  if (!name->is_string() || name->get<std::string>().empty())
    return std::string("\"name\" must be a non-empty string, got ") + (name->is_string() ? "\"\"" : json_type_name(*name));
  auto arguments = j.end();
  for (const std::string& key : arguments_keys) {
    arguments = j.find(key);
    if (arguments != j.end()) break;
  }
  if (arguments == j.end()) return "missing \"" + arguments_keys[0] + "\" (an object, {} for none)";
  nlohmann::ordered_json args = *arguments;
  if (args.is_string()) {  // arguments sent as a JSON-encoded string, as the OpenAI API writes them
    try {
      args = nlohmann::ordered_json::parse(args.get<std::string>());
    } catch (const nlohmann::json::exception& e) {
      return "\"" + arguments_keys[0] + "\" is a string that is not JSON: " + tool_call_parse_problem(e);
    }
  }
  if (!args.is_object())
    return "\"" + arguments_keys[0] + "\" must be a JSON object, got " + json_type_name(args);
  call.name = name->get<std::string>();
  call.arguments = std::move(args);
  return "";
}

std::string numbered(int attempt, const std::string& problem) {
  return "tool call " + std::to_string(attempt) + ": " + problem;
}

// One <tool_call> whose tags span [begin, end) and hold `json_text`: a call, or an error.
void add_hermes_call(std::string_view json_text, int attempt, size_t begin, size_t end, ParsedToolCalls& out) {
  ToolCall call;
  const std::string problem = tool_call_from_json(json_text, {"arguments"}, call);
  if (problem.empty()) {
    call.begin = begin;
    call.end = end;
    out.calls.push_back(std::move(call));
  } else {
    out.errors.push_back({numbered(attempt, problem), begin, end});
  }
}

ParsedToolCalls parse_hermes_tool_calls(std::string_view text) {
  ParsedToolCalls out;
  std::string content;
  int attempt = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t open = text.find(kToolCallOpenTag, pos);
    const size_t stray_close = text.find(kToolCallCloseTag, pos);
    if (stray_close < open) {
      content += text.substr(pos, stray_close - pos);
      out.errors.push_back({"</tool_call> without an opening <tool_call>", stray_close,
                            stray_close + kToolCallCloseTag.size()});
      pos = stray_close + kToolCallCloseTag.size();
      continue;
    }
    if (open == std::string_view::npos) {
      content += text.substr(pos);
      break;
    }
    content += text.substr(pos, open - pos);
    ++attempt;
    const size_t body = open + kToolCallOpenTag.size();
    // The JSON's own extent first, so that tags quoted inside its strings do not cut it.
    const size_t json_begin = skip_tool_call_space(text, body);
    if (json_begin < text.size() && text[json_begin] == '{') {
      const JsonScan scan = scan_tool_call_json(text, json_begin);
      const size_t after = scan.end == std::string_view::npos ? text.size() : skip_tool_call_space(text, scan.end);
      if (scan.end != std::string_view::npos && text.substr(after).starts_with(kToolCallCloseTag)) {
        add_hermes_call(text.substr(json_begin, scan.end - json_begin), attempt, open,
                        after + kToolCallCloseTag.size(), out);
        pos = after + kToolCallCloseTag.size();
        continue;
      }
    }
    const size_t close = text.find(kToolCallCloseTag, body);
    const size_t next_open = text.find(kToolCallOpenTag, body);
    if (close == std::string_view::npos || next_open < close) {
      const size_t end = close == std::string_view::npos ? text.size() : next_open;
      out.errors.push_back({numbered(attempt, "<tool_call> is not closed by </tool_call>"), open, end});
      pos = end;
      continue;
    }
    const size_t end = close + kToolCallCloseTag.size();
    add_hermes_call(trim_tool_call_space(text.substr(body, close - body)), attempt, open, end, out);
    pos = end;
  }
  out.content = std::string(trim_tool_call_space(content));
  return out;
}

ParsedToolCalls parse_llama3_json_tool_calls(std::string_view text) {
  ParsedToolCalls out;
  const size_t start = skip_tool_call_space(text, 0);
  const bool tagged = text.substr(start).starts_with(kLlamaPythonTag);
  size_t pos = tagged ? skip_tool_call_space(text, start + kLlamaPythonTag.size()) : start;
  if (pos >= text.size() || text[pos] != '{') {
    if (tagged) {
      out.errors.push_back({"<|python_tag|> is not followed by a JSON call {\"name\": ..., \"parameters\": {...}} "
                            "(built-in tool calls are not supported)",
                            start, text.size()});
    } else {
      out.content = std::string(text);
    }
    return out;
  }
  for (int attempt = 1;; ++attempt) {
    const size_t call_begin = attempt == 1 ? start : pos;
    const JsonScan scan = scan_tool_call_json(text, pos);
    if (scan.end == std::string_view::npos) {
      out.errors.push_back({numbered(attempt, scan.too_deep ? "the call's JSON is nested deeper than " +
                                                                  std::to_string(kToolCallMaxNesting) + " levels"
                                                            : "the JSON object is not closed"),
                            call_begin, text.size()});
      break;
    }
    ToolCall call;
    const std::string problem = tool_call_from_json(text.substr(pos, scan.end - pos), {"parameters", "arguments"}, call);
    if (problem.empty()) {
      call.begin = call_begin;
      call.end = scan.end;
      out.calls.push_back(std::move(call));
    } else {
      out.errors.push_back({numbered(attempt, problem), call_begin, scan.end});
    }
    pos = skip_tool_call_space(text, scan.end);
    if (pos == text.size()) break;
    if (text[pos] == ';') {
      pos = skip_tool_call_space(text, pos + 1);
      if (pos == text.size()) break;
      if (text[pos] == '{') continue;
    }
    out.errors.push_back({"text after the tool call: a Llama tool-call message holds only JSON calls separated by ';'",
                          pos, text.size()});
    break;
  }
  return out;
}

}  // namespace

ToolCallFormat tool_call_format_from_name(std::string_view name) {
  if (name == "hermes") return ToolCallFormat::hermes;
  if (name == "llama3_json") return ToolCallFormat::llama3_json;
  HF_FAIL("unknown tool-call format \"", std::string(name), "\"; expected \"hermes\" or \"llama3_json\"");
}

const char* tool_call_format_name(ToolCallFormat format) {
  return format == ToolCallFormat::hermes ? "hermes" : "llama3_json";
}

ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format) {
  return format == ToolCallFormat::hermes ? parse_hermes_tool_calls(text) : parse_llama3_json_tool_calls(text);
}

}  // namespace hybridflow::text
