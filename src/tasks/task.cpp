#include "hybridflow/tasks/task.h"

#include <cctype>

#include "hybridflow/core/error.h"

namespace hybridflow {

namespace {

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// Characters of the same kind as `c`, so a corrupted answer keeps the answer's shape.
std::string same_kind(char c) {
  if (std::isdigit(static_cast<unsigned char>(c))) return "0123456789";
  if (std::islower(static_cast<unsigned char>(c))) return "abcdefghijklmnopqrstuvwxyz";
  if (std::isupper(static_cast<unsigned char>(c))) return "ABCDEFGHIJKLMNOPQRSTUVWXYZ";
  return "";
}

}  // namespace

double Task::score(const std::string& response, const Example& example) const {
  return trim(response) == example.answer ? 1.0 : 0.0;
}

std::string Task::corrupt(const std::string& answer, std::mt19937_64& rng) const {
  std::vector<size_t> positions;
  for (size_t i = 0; i < answer.size(); ++i) {
    if (!same_kind(answer[i]).empty()) positions.push_back(i);
  }
  HF_CHECK(!positions.empty(), "task '", name(), "': cannot corrupt answer '", answer,
           "' (no digit or letter to change)");
  const size_t pos = positions[std::uniform_int_distribution<size_t>(0, positions.size() - 1)(rng)];
  const std::string pool = same_kind(answer[pos]);
  std::string out = answer;
  // Draw from the pool minus the current character, so the result always differs.
  size_t k = std::uniform_int_distribution<size_t>(0, pool.size() - 2)(rng);
  if (pool[k] == answer[pos]) k = pool.size() - 1;
  out[pos] = pool[k];
  return out;
}

}  // namespace hybridflow
