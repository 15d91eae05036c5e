#include "hybridflow/agent/tool_set.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <thread>

#include "hybridflow/core/error.h"

namespace hybridflow::agent {
namespace tool_set_detail {

// Byte offsets of the first `count` code points' end (a UTF-8 lead byte is any byte not 10xxxxxx).
size_t utf8_prefix_bytes(const std::string& text, int64_t count) {
  size_t i = 0;
  int64_t seen = 0;
  while (i < text.size()) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      if (seen == count) return i;
      ++seen;
    }
    ++i;
  }
  return text.size();
}

int64_t utf8_length(const std::string& text) {
  int64_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

}  // namespace tool_set_detail

using namespace tool_set_detail;

TruncateSide truncate_side_from_name(std::string_view name, const std::string& key) {
  if (name == "left") return TruncateSide::left;
  if (name == "right") return TruncateSide::right;
  if (name == "middle") return TruncateSide::middle;
  HF_FAIL(key, ": expected left, right or middle, got '", name, "'");
}

const char* truncate_side_name(TruncateSide side) {
  switch (side) {
    case TruncateSide::left: return "left";
    case TruncateSide::right: return "right";
    case TruncateSide::middle: return "middle";
  }
  return "?";
}

std::string truncate_tool_response(const std::string& text, int64_t max_chars, TruncateSide side, bool* truncated) {
  if (truncated != nullptr) *truncated = false;
  if (max_chars <= 0) return text;
  int64_t length = utf8_length(text);
  if (length <= max_chars) return text;
  if (truncated != nullptr) *truncated = true;
  std::string marker = "[... " + std::to_string(length - max_chars) + " characters truncated ...]";
  switch (side) {
    case TruncateSide::left:
      return text.substr(0, utf8_prefix_bytes(text, max_chars)) + "\n" + marker;
    case TruncateSide::right:
      return marker + "\n" + text.substr(utf8_prefix_bytes(text, length - max_chars));
    case TruncateSide::middle: {
      int64_t head = max_chars / 2 + max_chars % 2, tail = max_chars / 2;
      return text.substr(0, utf8_prefix_bytes(text, head)) + "\n" + marker + "\n" +
             text.substr(utf8_prefix_bytes(text, length - tail));
    }
  }
  return text;
}

void ToolSet::add(std::shared_ptr<const Tool> tool, const std::string& where) {
  HF_CHECK(tool != nullptr, "ToolSet::add: null tool");
  const Tool* existing = find(tool->name());
  HF_CHECK(existing == nullptr, where.empty() ? std::string() : where + ": ", "a tool named '", tool->name(),
           "' is already defined (", existing != nullptr ? existing->describe() : "", "); tool names must be unique");
  tools_.push_back(std::move(tool));
}

const Tool* ToolSet::find(const std::string& name) const {
  for (const auto& tool : tools_)
    if (tool->name() == name) return tool.get();
  return nullptr;
}

std::vector<std::string> ToolSet::names() const {
  std::vector<std::string> out;
  for (const auto& tool : tools_) out.push_back(tool->name());
  return out;
}

Json ToolSet::schemas() const {
  Json out = Json::array();
  for (const auto& tool : tools_) out.push_back(tool->schema());
  return out;
}

std::vector<ToolResult> ToolSet::run(const std::vector<ToolCallRequest>& calls, const Json& row_tools_kwargs,
                                     const ToolSetOptions& options) const {
  std::vector<ToolResult> results(calls.size());
  auto run_one = [&](size_t i) {
    const ToolCallRequest& call = calls[i];
    const Tool* tool = find(call.name);
    ToolResult result;
    if (tool == nullptr) {
      std::string known;
      for (const auto& name : names()) known += (known.empty() ? "" : ", ") + name;
      result = ToolResult::error(ToolStatus::unknown_tool, "no tool named '" + call.name + "' (available: " +
                                                               (known.empty() ? "none" : known) + ")");
    } else {
      Json kwargs = row_tools_kwargs.is_object() && row_tools_kwargs.contains(call.name) ? row_tools_kwargs[call.name]
                                                                                         : Json();
      try {
        result = tool->call(call.arguments, kwargs);
      } catch (const std::exception& e) {  // e.g. out of memory: still an answer in its place, never a crash
        result = ToolResult::error(ToolStatus::failed, "tool '" + call.name + "': " + e.what());
      }
    }
    result.text = truncate_tool_response(result.text, options.max_tool_response_length, options.truncate_side,
                                         &result.truncated);
    results[i] = std::move(result);
  };
  size_t workers = std::min<size_t>(calls.size(), static_cast<size_t>(std::max(1, options.max_parallel_calls)));
  if (workers <= 1) {
    for (size_t i = 0; i < calls.size(); ++i) run_one(i);
    return results;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t w = 0; w < workers; ++w)
    threads.emplace_back([&] {
      for (size_t i = next++; i < calls.size(); i = next++) run_one(i);
    });
  for (auto& t : threads) t.join();
  return results;
}

}  // namespace hybridflow::agent
