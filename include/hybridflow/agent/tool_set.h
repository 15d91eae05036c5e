// The tools of a run, called by name: one assistant turn's calls run concurrently (up to
// max_parallel_calls), results come back in call order, each cut to max_tool_response_length characters.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hybridflow/agent/tool.h"

namespace hybridflow::agent {

// Which part of an over-long tool response is kept (verl's tool_response_truncate_side): `left` keeps
// the beginning, `right` the end, `middle` both ends.
enum class TruncateSide { left, right, middle };
// "left", "right" or "middle"; else an Error naming `key`.
TruncateSide truncate_side_from_name(std::string_view name, const std::string& key);
const char* truncate_side_name(TruncateSide side);

// `text` cut to at most max_chars Unicode characters (never inside a UTF-8 sequence) plus a marker saying
// how many were dropped; unchanged (and *truncated false) when it fits. max_chars <= 0: no limit.
std::string truncate_tool_response(const std::string& text, int64_t max_chars, TruncateSide side, bool* truncated);

struct ToolSetOptions {
  int max_parallel_calls = 1;             // calls of one turn running at once
  int64_t max_tool_response_length = 256;  // characters of each result the model sees
  TruncateSide truncate_side = TruncateSide::middle;
};

struct ToolCallRequest {
  std::string name;
  Json arguments;  // as parsed from the model's text
};

class ToolSet {
 public:
  // Throws when a tool of that name is already in the set (`where` names the new one's source).
  void add(std::shared_ptr<const Tool> tool, const std::string& where = "");
  const Tool* find(const std::string& name) const;
  std::vector<std::string> names() const;
  size_t size() const { return tools_.size(); }
  bool empty() const { return tools_.empty(); }
  // The schemas, in the order the tools were added: the chat template's `tools`.
  Json schemas() const;

  // Runs one turn's calls; result i answers calls[i]. An unknown name is an `unknown_tool` result.
  // `row_tools_kwargs` is the row's tools_kwargs ({tool name: anything}, or null): each tool gets its entry.
  std::vector<ToolResult> run(const std::vector<ToolCallRequest>& calls, const Json& row_tools_kwargs,
                              const ToolSetOptions& options) const;

 private:
  std::vector<std::shared_ptr<const Tool>> tools_;
};

}  // namespace hybridflow::agent
