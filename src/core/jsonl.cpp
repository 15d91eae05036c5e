#include "hybridflow/core/jsonl.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string_view>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {

std::vector<nlohmann::json> parse_jsonl(const std::string& text, const std::string& source_name) {
  std::vector<nlohmann::json> rows;
  size_t start = 0;
  size_t line_no = 0;
  while (start < text.size()) {
    ++line_no;
    size_t end = text.find('\n', start);
    bool has_newline = end != std::string::npos;
    if (!has_newline) end = text.size();
    size_t stop = end;
    if (stop > start && text[stop - 1] == '\r') --stop;  // files written on Windows
    std::string_view line(text.data() + start, stop - start);
    start = end + 1;
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;
    try {
      rows.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::parse_error& e) {
      HF_FAIL(source_name, ":", line_no, ": invalid JSON: ", e.what(),
              has_newline ? "" : " (the last line has no newline: the file may have been cut off while writing)");
    }
  }
  return rows;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) { return parse_jsonl(read_file(path), path); }

std::string to_jsonl(const std::vector<nlohmann::json>& rows) {
  std::string out;
  for (size_t i = 0; i < rows.size(); ++i) {
    try {
      out += rows[i].dump();
    } catch (const nlohmann::json::exception& e) {
      HF_FAIL("cannot write row ", i, " as JSON: ", e.what());
    }
    out += '\n';
  }
  return out;
}

void write_jsonl(const std::string& path, const std::vector<nlohmann::json>& rows) {
  write_file_atomic(path, to_jsonl(rows));
}

void append_jsonl(const std::string& path, const std::vector<nlohmann::json>& rows) {
  std::string bytes = to_jsonl(rows);
  if (bytes.empty()) return;
  int fd = ::open(path.c_str(), O_RDWR | O_APPEND | O_CREAT, 0644);
  HF_CHECK(fd >= 0, "cannot open ", path, " for appending: ", std::strerror(errno));
  off_t size = ::lseek(fd, 0, SEEK_END);
  char last = '\n';
  if (size > 0 && ::pread(fd, &last, 1, size - 1) == 1 && last != '\n') bytes.insert(bytes.begin(), '\n');
  size_t written = 0;
  while (written < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      ::close(fd);
      HF_FAIL("cannot append to ", path, ": ", std::strerror(err));
    }
    written += static_cast<size_t>(n);
  }
  HF_CHECK(::close(fd) == 0, "cannot close ", path, ": ", std::strerror(errno));
}

void append_jsonl(const std::string& path, const nlohmann::json& row) {
  append_jsonl(path, std::vector<nlohmann::json>{row});
}

}  // namespace hybridflow
