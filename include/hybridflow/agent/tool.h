// A tool the policy can call during a rollout: an OpenAI function schema (what the chat template shows the
// model) and a call that turns JSON arguments into text for the model. A call never throws for a tool's
// failure: invalid arguments, a timeout, a crash, too much output come back as an error result whose
// text tells the model what went wrong, so that one bad call never stops a run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace hybridflow::agent {

// Ordered, so that schemas render in the order they were written (as transformers renders them).
using Json = nlohmann::ordered_json;

enum class ToolStatus {
  ok,
  invalid_arguments,  // not an object, a required argument missing, a declared type or enum not met
  unknown_tool,       // the model named a tool that is not configured
  failed,             // the tool ran and failed: non-zero exit, HTTP error, isError, cannot reach it
  timed_out,          // it ran past its time limit and was stopped
  output_limit,       // it wrote more than its byte limit and was stopped
};
const char* tool_status_name(ToolStatus status);

struct ToolResult {
  ToolStatus status = ToolStatus::ok;
  std::string text;        // what the model sees; errors start with "Error: "
  double seconds = 0;      // wall-clock time of the call
  bool truncated = false;  // cut to max_tool_response_length by the ToolSet
  bool ok() const { return status == ToolStatus::ok; }
  static ToolResult error(ToolStatus status, const std::string& message);
};

class Tool {
 public:
  // `schema` is {"type": "function", "function": {"name", "description", "parameters"}}; throws
  // hybridflow::Error naming `where` and the key when it is not of that form.
  Tool(Json schema, const std::string& where);
  virtual ~Tool() = default;
  Tool(const Tool&) = delete;
  Tool& operator=(const Tool&) = delete;

  const std::string& name() const { return name_; }
  const Json& schema() const { return schema_; }
  // "command 'python3 calc.py'", "http 'http://...'": for logs and error messages.
  virtual std::string describe() const = 0;

  // Checks the arguments against the schema, then runs the tool. `kwargs` is this tool's entry of the
  // row's tools_kwargs (null when none). Thread-safe: a ToolSet calls it from several threads at once.
  ToolResult call(const Json& arguments, const Json& kwargs) const;

 protected:
  // The tool's work; may throw (the exception's message becomes a `failed` result).
  virtual ToolResult run(const Json& arguments, const Json& kwargs) const = 0;

 private:
  Json schema_;
  std::string name_;
};

// "" when `arguments` satisfy the JSON-schema subset tools use (an object; `required` keys present;
// each declared property's `type` and `enum`; no other keys when additionalProperties is false),
// else a message for the model naming the argument.
std::string check_tool_arguments(const Json& parameters, const Json& arguments);

}  // namespace hybridflow::agent
