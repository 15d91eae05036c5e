#include "hybridflow/agent/tool.h"

#include <chrono>
#include <cmath>
#include <cstdint>
#include <exception>

#include "hybridflow/core/error.h"

namespace hybridflow::agent {
namespace tool_detail {

bool json_has_type(const Json& value, const std::string& type) {
  if (type == "string") return value.is_string();
  if (type == "number") return value.is_number();
  if (type == "integer") {
    if (value.is_number_integer()) return true;
    if (!value.is_number_float()) return false;
    double d = value.get<double>();
    return std::isfinite(d) && std::floor(d) == d;  // 3.0 is an integer to JSON schema
  }
  if (type == "boolean") return value.is_boolean();
  if (type == "array") return value.is_array();
  if (type == "object") return value.is_object();
  if (type == "null") return value.is_null();
  return true;  // a type this checker does not know: the tool judges
}

std::string type_name_of(const Json& value) {
  if (value.is_string()) return "string";
  if (value.is_boolean()) return "boolean";
  if (value.is_number_integer()) return "integer";
  if (value.is_number()) return "number";
  if (value.is_array()) return "array";
  if (value.is_object()) return "object";
  return "null";
}

std::string clip_for_message(const std::string& s, size_t max = 80) {
  return s.size() <= max ? s : s.substr(0, max) + "...";
}

}  // namespace tool_detail

using namespace tool_detail;

const char* tool_status_name(ToolStatus status) {
  switch (status) {
    case ToolStatus::ok: return "ok";
    case ToolStatus::invalid_arguments: return "invalid_arguments";
    case ToolStatus::unknown_tool: return "unknown_tool";
    case ToolStatus::failed: return "failed";
    case ToolStatus::timed_out: return "timed_out";
    case ToolStatus::output_limit: return "output_limit";
  }
  return "?";
}

ToolResult ToolResult::error(ToolStatus status, const std::string& message) {
  ToolResult result;
  result.status = status;
  result.text = "Error: " + message;
  return result;
}

Tool::Tool(Json schema, const std::string& where) : schema_(std::move(schema)) {
  HF_CHECK(schema_.is_object(), where, ": tool_schema: expected a map {type: function, function: {...}}, got ",
           clip_for_message(schema_.dump()));
  HF_CHECK(schema_.value("type", Json()) == "function", where, ": tool_schema.type: expected 'function', got ",
           schema_.contains("type") ? schema_["type"].dump() : std::string("nothing"));
  HF_CHECK(schema_.contains("function") && schema_["function"].is_object(), where,
           ": tool_schema.function: expected a map with name, description and parameters");
  const Json& function = schema_["function"];
  HF_CHECK(function.contains("name") && function["name"].is_string() && !function["name"].get<std::string>().empty(),
           where, ": tool_schema.function.name: expected a non-empty string");
  name_ = function["name"].get<std::string>();
  if (function.contains("parameters")) {
    const Json& parameters = function["parameters"];
    HF_CHECK(parameters.is_object(), where, ": tool_schema.function.parameters: expected a JSON schema map");
    if (parameters.contains("required")) {
      HF_CHECK(parameters["required"].is_array(), where,
               ": tool_schema.function.parameters.required: expected a list of argument names");
      for (const auto& r : parameters["required"])
        HF_CHECK(r.is_string(), where, ": tool_schema.function.parameters.required: expected names, got ", r.dump());
    }
    if (parameters.contains("properties"))
      HF_CHECK(parameters["properties"].is_object(), where,
               ": tool_schema.function.parameters.properties: expected a map of argument schemas");
  }
}

ToolResult Tool::call(const Json& arguments, const Json& kwargs) const {
  auto start = std::chrono::steady_clock::now();
  ToolResult result;
  const Json& function = schema_["function"];
  std::string problem =
      function.contains("parameters") ? check_tool_arguments(function["parameters"], arguments) : std::string();
  if (!problem.empty()) {
    result = ToolResult::error(ToolStatus::invalid_arguments, "tool '" + name_ + "': " + problem);
  } else {
    try {
      result = run(arguments, kwargs);
    } catch (const std::exception& e) {
      result = ToolResult::error(ToolStatus::failed, "tool '" + name_ + "': " + e.what());
    }
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

std::string check_tool_arguments(const Json& parameters, const Json& arguments) {
  if (!arguments.is_object()) return "arguments must be a JSON object, got " + type_name_of(arguments);
  if (parameters.contains("required") && parameters["required"].is_array())
    for (const auto& required : parameters["required"])
      if (required.is_string() && !arguments.contains(required.get<std::string>()))
        return "missing required argument '" + required.get<std::string>() + "'";
  const Json empty = Json::object();
  const Json& properties =
      parameters.contains("properties") && parameters["properties"].is_object() ? parameters["properties"] : empty;
  bool closed = parameters.contains("additionalProperties") && parameters["additionalProperties"] == false;
  for (const auto& [key, value] : arguments.items()) {
    if (!properties.contains(key)) {
      if (closed) return "unknown argument '" + key + "'";
      continue;
    }
    const Json& property = properties[key];
    if (!property.is_object()) continue;
    if (property.contains("type")) {
      const Json& type = property["type"];
      bool matches = false;
      std::string wanted;
      if (type.is_string()) {
        matches = json_has_type(value, type.get<std::string>());
        wanted = type.get<std::string>();
      } else if (type.is_array()) {
        for (const auto& t : type) {
          if (!t.is_string()) continue;
          matches = matches || json_has_type(value, t.get<std::string>());
          wanted += (wanted.empty() ? "" : " or ") + t.get<std::string>();
        }
      } else {
        matches = true;
      }
      if (!matches)
        return "argument '" + key + "' must be " + wanted + ", got " + type_name_of(value) + " " +
               clip_for_message(value.dump());
    }
    if (property.contains("enum") && property["enum"].is_array()) {
      bool listed = false;
      for (const auto& allowed : property["enum"]) listed = listed || allowed == value;
      if (!listed)
        return "argument '" + key + "' must be one of " + clip_for_message(property["enum"].dump(), 200) + ", got " +
               clip_for_message(value.dump());
    }
  }
  return "";
}

}  // namespace hybridflow::agent
