// Tool calls parsed out of a model's sampled text, in the formats the chat templates tell the model to
// use. Parsing never throws on the text: a malformed call (unclosed tag, invalid JSON, no name, ...)
// comes back as a ToolCallError with its byte span, for a rollout to show the model as a tool error
// instead of stopping.
//
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of them among
//                other text (Qwen2.5 and Qwen3 templates; whitespace inside the tags is ignored).
//   llama3_json  the whole message is one JSON call {"name": ..., "parameters": {...}}, optionally
//                after <|python_tag|>; several calls may be separated by ';' (Llama 3.1 / 3.2 custom
//                tools). "arguments" is accepted for "parameters". A message not starting with '{'
//                (after the tag) is plain content.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace hybridflow::text {

enum class ToolCallFormat { hermes, llama3_json };

// "hermes" or "llama3_json"; throws hybridflow::Error naming the accepted names otherwise.
ToolCallFormat tool_call_format_from_name(std::string_view name);
const char* tool_call_format_name(ToolCallFormat format);

struct ToolCall {
  std::string name;
  nlohmann::ordered_json arguments;  // always an object
  size_t begin = 0;                  // the call's bytes in the parsed text: [begin, end)
  size_t end = 0;
};

struct ToolCallError {
  std::string message;  // what is wrong, for the model and the logs
  size_t begin = 0;     // the offending bytes: [begin, end)
  size_t end = 0;
};

struct ParsedToolCalls {
  // hermes: the text outside all call and error spans, surrounding whitespace trimmed.
  // llama3_json: the whole text when it holds no call attempt, else "".
  std::string content;
  std::vector<ToolCall> calls;         // in order of appearance
  std::vector<ToolCallError> errors;   // in order of appearance; calls and errors never overlap
  bool ok() const { return errors.empty(); }
};

// The tool calls in one assistant turn's decoded text (special tokens kept, so <|python_tag|> is seen).
ParsedToolCalls parse_tool_calls(std::string_view text, ToolCallFormat format);

}  // namespace hybridflow::text
