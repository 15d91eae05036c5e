// Scripted episodes for the continuous-batching tests of agentic rollouts: prompts, turns and "tool results"
// of known shapes, over any model with a vocabulary of at least 41 ids.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/workers/agent_rollout.h"

namespace hybridflow::testing {

// Episode i of the continuous-batching tests: a prompt of its own, then (i % 3) + 1 assistant turns of at most
// 7 ids, each but the last followed by a "tool result" of (i + turn) % 5 + 1 ids the model did not sample; it
// stops, as run_episode does, when the next tool result would not fit the response budget. With group_size g,
// episodes [k*g, (k+1)*g) have the same prompt (GRPO's n samples of one prompt), of 3 + 5 * (k % 2) ids.
inline EpisodeFunction tool_episodes(std::vector<agent::Trajectory>& out, int64_t budget, int64_t group_size = 1) {
  return [&out, budget, group_size](int64_t i, const agent::TurnSampler& sample) {
    agent::Trajectory& t = out[static_cast<size_t>(i)];
    const int64_t prompt = i / group_size;
    t.prompt_ids = {5, static_cast<int32_t>(10 + prompt), 2};
    const int64_t extra = group_size == 1 ? i % 4 : 5 * (prompt % 2);
    for (int64_t k = 0; k < extra; ++k) t.prompt_ids.push_back(static_cast<int32_t>(20 + k));
    const int turns = static_cast<int>(i % 3) + 1;
    for (int turn = 0; turn < turns; ++turn) {
      const int64_t left = budget - static_cast<int64_t>(t.response_ids.size());
      std::vector<int32_t> context = t.prompt_ids;
      context.insert(context.end(), t.response_ids.begin(), t.response_ids.end());
      const std::vector<int32_t> ids = sample(context, std::min<int64_t>(7, left));
      t.response_ids.insert(t.response_ids.end(), ids.begin(), ids.end());
      t.response_mask.insert(t.response_mask.end(), ids.size(), 1);
      const int64_t tool = (i + turn) % 5 + 1;
      if (turn + 1 == turns || static_cast<int64_t>(t.response_ids.size()) + tool >= budget) break;
      for (int64_t k = 0; k < tool; ++k) {
        t.response_ids.push_back(static_cast<int32_t>(30 + (i + k) % 9));
        t.response_mask.push_back(0);
      }
    }
  };
}

// An episode's log-probs against the reference's: bit for bit when exact, else within 1e-5.
inline void expect_same_log_probs(const std::vector<float>& got, const std::vector<float>& want, bool exact,
                                  const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t k = 0; k < want.size(); ++k) {
    if (exact)
      EXPECT_EQ(got[k], want[k]) << what << " token " << k;
    else
      EXPECT_NEAR(got[k], want[k], 1e-5) << what << " token " << k;
  }
}

}  // namespace hybridflow::testing
