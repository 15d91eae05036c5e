// The responses of a partial rollout that a checkpoint stopped between two tokens, as tensors that travel
// with the rollout's request (one row per prompt, so that the rollout protocol splits them with their
// prompts over the replicas) and that the checkpoint stores: the tokens drawn so far, their sampled
// log-probs and policy versions, and which samples had ended. A generate_sequences request that holds them
// continues those responses instead of starting them again.
//   partial_responses      [prompts, n, response_length] int64 (pad past each sample's length)
//   partial_log_probs      [prompts, n, response_length] float32
//   partial_token_versions [prompts, n, response_length] int64
//   partial_lengths        [prompts, n] int64: tokens drawn per sample
//   partial_finished       [prompts, n] int64: 1 when the sample had ended (eos or response_length)
#pragma once

#include <string>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/generation.h"

namespace hybridflow {

// The state of a stopped generation (out.stopped) of `prompts` prompts x n samples; meta "partial" true.
DataProto partial_rollout_state(const GenerationOutput& out, int64_t prompts, int64_t n, int64_t response_length,
                                int64_t pad_token_id);

// Whether `batch` is a stopped generation's state (partial_rollout_state) rather than a rollout batch.
bool is_partial_rollout_state(const DataProto& batch);

// `request` with the partial_* tensors of `state` (a generate_sequences request that continues them).
DataProto continuation_request(const DataProto& request, const DataProto& state);

// Whether a generate_sequences request continues partial responses.
bool holds_partial_responses(const DataProto& request);

// The saved sequences of a request that holds partial responses, checked: shapes [request rows, n,
// response_length], lengths within the response length, log-probs finite, versions at most
// `newest_version`. `source` names where they came from (a checkpoint file) in the errors.
PartialSequences partial_sequences_of(const DataProto& request, int64_t n, int64_t response_length,
                                      int64_t newest_version, const std::string& source);

}  // namespace hybridflow
