// The schedule of a TurnBatcher (engine/turn_batcher.h) under tensor parallelism or pipeline stages: rank 0
// of the model's group (tensor-parallel rank 0, or stage 0) runs the episodes (and so every tool call, once) and drives its batcher; every other rank runs no episode
// and makes the same calls on its own batcher, in the same order, so that the collectives inside each
// prefill and decode step meet. One TurnScheduleStep per iteration of the driving loop carries what rank 0
// did: the conversations it released, the turns it submitted (their whole contexts: every rank sees the
// same appended ids) and whether it stepped. The tokens each step draws are rank 0's (tensor parallelism) or
// the last stage's (the batcher broadcasts them), so every rank's turns end at the same token. A step that
// carries nothing (no release, no submit, no step) is a keep-alive: rank 0 sends one while it waits for
// tools, so that the others' wait in the broadcast never reaches the collectives' timeout.
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
  // Nothing to do: a keep-alive.
  bool empty() const { return released.empty() && submitted.empty() && !step && !done; }
};

// Rank 0's `step` on every rank of `group` (in place; two broadcasts of int64 tensors on `device`, the one the
// group's backend communicates on).
void share_turn_schedule(TurnScheduleStep& step, Communicator& group, torch::Device device);

// A rank other than 0: applies rank 0's steps to `batcher` until one says done, and returns how many of them
// were keep-alives. A failure of a step is kept and rethrown after done (rank 0 stops stepping when its own
// step fails the same way).
int64_t follow_turn_schedule(TurnBatcher& batcher, Communicator& group, torch::Device device);

}  // namespace hybridflow
