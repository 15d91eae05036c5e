// DAPO's two batch-level formulas (arXiv 2503.14476) as pure functions; the trainer decides when to use them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace hybridflow::algo {

// Overlong reward shaping (verl's DAPO reward manager, reward_model.overlong_buffer): a response longer than
// max_response_length - overlong_buffer_len loses penalty_factor per buffer length it runs into,
//   penalty = min(-(len - (max_response_length - overlong_buffer_len)) / overlong_buffer_len * penalty_factor, 0).
// response_lengths [B] (valid tokens per response, any numeric dtype) -> [B] float penalties, added to the
// score. overlong_buffer_len must be in (0, max_response_length].
at::Tensor overlong_penalty(const at::Tensor& response_lengths, int64_t max_response_length,
                            int64_t overlong_buffer_len, double penalty_factor);

// Dynamic sampling's group filter (verl's algorithm.filter_groups): keeps the rows of every group whose
// metric values are not all equal, and the rows of groups of one (verl keeps uids with std > 0 or a single
// sample). metric [B] per-row values (e.g. acc or the sequence score), index [B] int64 group ids (prompt
// per row) -> [B] bool, true for the rows to keep. "Not all equal" is tested exactly (max > min), where
// verl's np.std may come out a rounding error above 0 for equal non-dyadic values such as 0.1.
at::Tensor dynamic_sampling_keep(const at::Tensor& metric, const at::Tensor& index);

}  // namespace hybridflow::algo
