// The schedule of a TurnBatcher (engine/turn_batcher.h) under tensor parallelism: rank 0 of the model's group
// runs the episodes (and so every tool call, once) and drives its batcher; every other rank runs no episode
// and makes the same calls on its own batcher, in the same order, so that the collectives inside each
// prefill and decode step meet. One TurnScheduleStep per iteration of the driving loop carries what rank 0
// did: the conversations it released, the turns it submitted (their whole contexts: every rank sees the
// same appended ids) and whether it stepped. The tokens each step draws are rank 0's (the batcher
// broadcasts them), so the other ranks' turns end where rank 0's do.
#pragma once

#include <cstdint>
#include <vector>

#include "hybridflow/engine/turn_batcher.h"

namespace hybridflow {

class Communicator;

struct TurnScheduleStep {
  struct Submit {
    int64_t conversation = 0;
    int64_t max_new_tokens = 0;
    std::vector<int64_t> context;
  };
  std::vector<int64_t> released;  // released first, in order
  std::vector<Submit> submitted;  // then submitted, in order
  bool step = false;              // then one TurnBatcher::step()
  bool done = false;              // the rollout is over: nothing else follows
};

// Rank 0's `step` on every rank of `group` (in place; two broadcasts of int64 tensors on `device`, the one the
// group's backend communicates on).
void share_turn_schedule(TurnScheduleStep& step, Communicator& group, torch::Device device);

// A rank other than 0: applies rank 0's steps to `batcher` until one says done. A failure of a step is kept
// and rethrown after done (rank 0 stops stepping when its own step fails the same way).
void follow_turn_schedule(TurnBatcher& batcher, Communicator& group, torch::Device device);

}  // namespace hybridflow
