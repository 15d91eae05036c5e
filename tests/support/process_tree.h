// Watching a process a test started and the workers it forked, through /proc (Linux): whether one still
// runs, its live children, and how many lines a run has written to a file it appends to.
#pragma once

#include <sys/types.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace hybridflow::testing {

// Non-empty lines in `path` (0 when it does not exist yet).
inline int64_t lines_in(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

// Live (not zombie) processes whose parent is `pid`.
inline std::vector<pid_t> live_children(pid_t pid) {
  std::vector<pid_t> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream stat(entry.path() / "stat");
    std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
    const size_t close = text.rfind(')');  // "pid (comm) state ppid ..."; comm may hold spaces
    if (close == std::string::npos) continue;
    char state = 0;
    int ppid = 0;
    if (std::sscanf(text.c_str() + close + 1, " %c %d", &state, &ppid) == 2 && ppid == pid && state != 'Z')
      out.push_back(static_cast<pid_t>(std::stoi(name)));
  }
  return out;
}

// True while `pid` exists and is not a zombie.
inline bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z';
}

}  // namespace hybridflow::testing
