// JSON Lines files: datasets (one sample per line) and metric logs (one record per step).
#pragma once

#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {

// Blank lines are skipped; a line that is not valid JSON -> Error naming "<path>:<line>".
std::vector<nlohmann::json> read_jsonl(const std::string& path);
// Same for text already in memory; `source_name` stands in for the path in errors.
std::vector<nlohmann::json> parse_jsonl(const std::string& text, const std::string& source_name);

// Calls row(value, where) for each non-blank line of the file at `path`, parsed as Json (nlohmann::json, or
// nlohmann::ordered_json to keep a row's key order); where = "<path>:<line>" for the caller's own errors. A line
// that is not JSON -> Error naming it.
template <typename Json, typename Fn>
void for_each_jsonl_row(const std::string& path, Fn&& row) {
  std::istringstream in(read_file(path));
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = path + ":" + std::to_string(number);
    Json value;
    try {
      value = Json::parse(line);
    } catch (const std::exception& e) {
      HF_FAIL(where, ": not valid JSON: ", e.what());
    }
    row(value, where);
  }
}

// One compact line per value (UTF-8; non-UTF-8 strings -> Error naming the row).
std::string to_jsonl(const std::vector<nlohmann::json>& rows);
// Replaces the file atomically: readers see the old or the new file, never a mix.
void write_jsonl(const std::string& path, const std::vector<nlohmann::json>& rows);
// Appends the rows with one write() on an O_APPEND descriptor, so concurrent appenders do not interleave
// within a line. If the file ends in a line cut off by a crash, a newline is written first so the new
// rows stay readable (the cut line itself is still reported by read_jsonl).
void append_jsonl(const std::string& path, const std::vector<nlohmann::json>& rows);
void append_jsonl(const std::string& path, const nlohmann::json& row);

}  // namespace hybridflow
