// Two turns of every conversation of a TurnBatcher, all submitted together: the prompt, a first turn of up to
// `first` ids, a "tool result" of 3 ids, a second turn of up to `second`. Shared by the turn batcher's CPU tests
// and its GPU parity check.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "hybridflow/engine/turn_batcher.h"

namespace hybridflow::testing {

// prompts[c] is conversation c's prompt. Returns each conversation's turns in order; the conversations are left
// holding their blocks.
inline std::vector<std::vector<BatchedTurn>> two_turns_each(TurnBatcher& b,
                                                            const std::vector<std::vector<int64_t>>& prompts,
                                                            int64_t first = 7, int64_t second = 5) {
  const auto count = static_cast<int64_t>(prompts.size());
  std::vector<std::vector<BatchedTurn>> turns(prompts.size());
  std::vector<std::vector<int64_t>> contexts = prompts;
  for (int turn = 0; turn < 2; ++turn) {
    for (int64_t c = 0; c < count; ++c) b.submit(c, contexts[static_cast<size_t>(c)], turn == 0 ? first : second);
    int64_t ended = 0;
    for (int step = 0; step < 100 && ended < count; ++step)
      for (BatchedTurn& t : b.step()) {
        std::vector<int64_t>& context = contexts[static_cast<size_t>(t.conversation)];
        context.insert(context.end(), t.ids.begin(), t.ids.end());
        for (int64_t id : {int64_t{7}, int64_t{8}, 30 + t.conversation}) context.push_back(id);
        turns[static_cast<size_t>(t.conversation)].push_back(std::move(t));
        ++ended;
      }
    EXPECT_EQ(ended, count) << "turn " << turn;
  }
  return turns;
}

}  // namespace hybridflow::testing
