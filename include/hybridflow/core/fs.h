// Files written so that a crash never leaves a half-written file behind.
#pragma once

#include <string>

namespace hybridflow {

// Writes to "<path>.tmp.<pid>", fsyncs, then renames over `path`.
void write_file_atomic(const std::string& path, const std::string& bytes);
std::string read_file(const std::string& path);  // throws hybridflow::Error naming the path
bool file_exists(const std::string& path);
void make_dirs(const std::string& path);

}  // namespace hybridflow
