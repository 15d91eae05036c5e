#include "hybridflow/runtime/future.h"

#include <chrono>
#include <exception>

namespace hybridflow {

Future Future::ready(DataProto value) {
  std::promise<std::shared_ptr<const CallResult>> p;
  auto result = std::make_shared<CallResult>();
  result->merged = std::move(value);
  p.set_value(std::move(result));
  return Future(p.get_future().share());
}

bool Future::is_ready() const { return wait_for(0); }

bool Future::wait_for(double seconds) const {
  return f_.wait_for(std::chrono::duration<double>(seconds)) == std::future_status::ready;
}

void wait_all(const std::vector<Future>& futures) {
  std::exception_ptr first;
  for (const auto& f : futures) {
    try {
      f.get();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace hybridflow
