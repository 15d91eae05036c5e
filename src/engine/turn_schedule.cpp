// A TurnBatcher's schedule shared over a tensor-parallel group or pipeline stages; see engine/turn_schedule.h.
#include "hybridflow/engine/turn_schedule.h"

#include <exception>

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// Layout: a header [released, submitted, flags, payload length], then the payload: the released ids, then per
// submitted turn its conversation, max_new_tokens, context length and context ids.
void share_turn_schedule(TurnScheduleStep& step, Communicator& group, torch::Device device) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const bool root = group.rank() == 0;
  std::vector<int64_t> payload;
  if (root) {
    payload = step.released;
    for (const auto& s : step.submitted) {
      payload.insert(payload.end(), {s.conversation, s.max_new_tokens, static_cast<int64_t>(s.context.size())});
      payload.insert(payload.end(), s.context.begin(), s.context.end());
    }
  }
  torch::Tensor header = torch::tensor(std::vector<int64_t>{static_cast<int64_t>(step.released.size()),
                                                            static_cast<int64_t>(step.submitted.size()),
                                                            (step.step ? 1 : 0) | (step.done ? 2 : 0),
                                                            static_cast<int64_t>(payload.size())},
                                       i64)
                             .to(device);
  group.broadcast(header, 0);
  const auto h = header.to(torch::kCPU);
  const int64_t released = h[0].item<int64_t>(), submitted = h[1].item<int64_t>();
  const int64_t flags = h[2].item<int64_t>(), length = h[3].item<int64_t>();
  if (length > 0) {
    torch::Tensor body = root ? torch::tensor(payload, i64).to(device) : torch::empty({length}, i64.device(device));
    group.broadcast(body, 0);
    if (!root) {
      const auto cpu = body.to(torch::kCPU).contiguous();
      payload.assign(cpu.data_ptr<int64_t>(), cpu.data_ptr<int64_t>() + length);
    }
  }
  if (root) return;
  step = TurnScheduleStep{};
  step.step = (flags & 1) != 0;
  step.done = (flags & 2) != 0;
  size_t at = 0;
  auto next = [&]() {
    HF_CHECK(at < payload.size(), "turn schedule: rank 0's step of ", payload.size(), " ids ended early");
    return payload[at++];
  };
  for (int64_t k = 0; k < released; ++k) step.released.push_back(next());
  for (int64_t k = 0; k < submitted; ++k) {
    TurnScheduleStep::Submit s;
    s.conversation = next();
    s.max_new_tokens = next();
    const int64_t ids = next();
    HF_CHECK(ids >= 0 && at + static_cast<size_t>(ids) <= payload.size(), "turn schedule: a context of ", ids,
             " ids passes rank 0's step of ", payload.size());
    s.context.assign(payload.begin() + static_cast<std::ptrdiff_t>(at),
                     payload.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(ids)));
    at += static_cast<size_t>(ids);
    step.submitted.push_back(std::move(s));
  }
}

int64_t follow_turn_schedule(TurnBatcher& batcher, Communicator& group, torch::Device device) {
  HF_CHECK(group.rank() != 0, "turn schedule: rank 0 drives the schedule; it does not follow one");
  std::exception_ptr failed;
  int64_t keep_alives = 0;
  while (true) {
    TurnScheduleStep step;
    share_turn_schedule(step, group, device);
    if (step.done) break;
    if (step.empty()) ++keep_alives;
    try {
      for (int64_t c : step.released) batcher.release(c);
      for (auto& s : step.submitted) batcher.submit(s.conversation, std::move(s.context), s.max_new_tokens);
      if (step.step) (void)batcher.step();
    } catch (...) {
      if (!failed) failed = std::current_exception();
    }
  }
  if (failed) std::rethrow_exception(failed);
  return keep_alives;
}

}  // namespace hybridflow
