// Errors: one exception type for everything a user can cause (bad config, bad file, bad input),
// with a message that says where and what was expected.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace hybridflow {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

namespace detail {
template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

}  // namespace hybridflow

// HF_CHECK(cond, parts...): throws hybridflow::Error built from the streamed parts when cond is false.
#define HF_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) throw ::hybridflow::Error(::hybridflow::detail::concat(__VA_ARGS__)); \
  } while (0)

#define HF_FAIL(...) throw ::hybridflow::Error(::hybridflow::detail::concat(__VA_ARGS__))
