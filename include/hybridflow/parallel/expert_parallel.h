// Expert parallelism (Megatron's expert_model_parallel_size): the ranks of an expert-parallel group each hold
// num_experts / n of a mixture-of-experts layer's experts and their own tokens. Every rank routes its tokens
// with the replicated router, sends each (token, expert) pair to the rank that owns the expert (an uneven
// all-to-all), runs its experts on what it received and sends the outputs back the same way, where they are
// weighted and summed per token. The non-expert weights are replicated, as under data parallelism.
//
// Gradient convention: the backward of an exchange is the reverse exchange, so an expert's gradient on its
// owner already sums the contributions of every rank's tokens (each weighted as that rank's loss weighs them).
// Expert gradients are therefore never averaged over the expert-parallel group; ranks of other groups that own
// the same experts (expert data parallelism) sum theirs. The replicated weights are reduced as data parallelism
// reduces them. engine/train_engine.h: set_expert_parallel.
//
// Every function here is the identity for a group of size 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// An expert-parallel group (collectives.h).
using ExpertParallelGroup = ParallelGroup;

// counts (a multiple of the group size n long) in n equal chunks, chunk j for rank j; returns the chunks the
// ranks sent here, chunk i from rank i. One equal all-to-all of integers (e.g. tokens per expert).
std::vector<int64_t> exchange_counts(const std::vector<int64_t>& counts, const ExpertParallelGroup& ep);

// x [rows, ...]: its first send_rows[0] rows go to rank 0, the next send_rows[1] to rank 1, ...; returns the rows
// the ranks sent here, in rank order (recv_rows[i] from rank i). Backward: the reverse exchange of the gradient.
at::Tensor exchange_rows(const at::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows, const ExpertParallelGroup& ep);

}  // namespace hybridflow
