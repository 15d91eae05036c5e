// Ulysses sequence parallelism (verl's ulysses_sequence_parallel_size, after DeepSpeed-Ulysses): the ranks of a
// sequence-parallel group each hold one contiguous slice of every sequence through the token-wise parts of a
// decoder layer (embedding, norms, projections, MLP), and around attention an all-to-all trades the sequence
// split for a split of the attention heads, so that each rank attends over whole sequences for its share of
// the heads. Activations per rank fall by the group size; the weights are replicated.
//
// Gradient convention: the model gathers its final hidden states over the group (gather_sequence), so the
// head and the loss run replicated on every rank, and that gather's backward scales this rank's slice of the
// gradient by the group size. A parameter's gradient averaged over the group (ReduceOp::kAvg) is then the
// gradient of one process: the layers' partial gradients sum (each scaled by the size, then divided by it), and
// the replicated head's equal gradients average to themselves. A data-parallel all-reduce that averages over
// every rank of a role (sequence-parallel ranks included) therefore needs nothing else.
//
// Every function here is the identity for a group of size 1.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

// A sequence-parallel group (collectives.h).
using SequenceParallelGroup = ParallelGroup;

// The sequence length rounded up to a multiple of the group size (the model pads with masked positions).
int64_t sequence_parallel_padded_length(int64_t length, int size);

// x [B, T / n, N, d] (this rank's slice of the sequence, all N heads) -> [B, T, N / n, d] (the whole sequence,
// this rank's heads: rank r gets heads [r N / n, (r + 1) N / n)). One all-to-all; its backward is the inverse.
at::Tensor sequence_to_head_split(const at::Tensor& x, const SequenceParallelGroup& sp);
// The inverse: [B, T, N / n, d] -> [B, T / n, N, d].
at::Tensor head_to_sequence_split(const at::Tensor& x, const SequenceParallelGroup& sp);
// x [B, T / n, ...] -> [B, T, ...], the ranks' slices in rank order. Backward: this rank's slice of the
// gradient times n (see the gradient convention above).
at::Tensor gather_sequence(const at::Tensor& x, const SequenceParallelGroup& sp);

}  // namespace hybridflow
