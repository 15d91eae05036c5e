// ZeRO stage 1 for TrainEngine: data-parallel ranks each keep 1/d of the optimizer state. Gradients are
// reduce-scattered (each rank receives the sum of only its partition), the rank steps AdamW on its
// partition of the fp32 weights, and an all-gather brings every rank the updated weights. The arithmetic
// is AdamW's, element for element, so the result equals plain data parallelism; the Adam moments and fp32
// master weights on a rank shrink to 1/d.
//
// Parameters are laid out as two flat buffers (weight-decayed and not), each padded to a multiple of d
// and cut into d equal partitions in data-parallel rank order.
//
// With pipeline stages, each stage's data-parallel group partitions that stage's parameters; the gradient
// norm sums over the stages and counts a tied embedding's last-stage copy once (its gradient, summed over
// the first and last stages before the step, is the same on both).
//
// With expert parallelism (as Megatron's distributed optimizer) the experts' state is partitioned only over the
// ranks that own the same experts (the expert-data-parallel group, which may be this rank alone): they are
// laid out in two buffers of their own, reduce-scattered and all-gathered over that group. Every expert element
// then sits in exactly one rank's partition over the data-parallel group, as every replicated one does, so the
// gradient norm's sum over the data-parallel group counts each parameter once.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <vector>

#include "hybridflow/parallel/collectives.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

struct OptimizerOptions;

class ZeroOptimizer {
 public:
  // params: the module's trainable parameters; decay[i]: AdamW weight decay applies to params[i];
  // split[i]: params[i] is a tensor-parallel shard (its squared gradient norm is summed over tp);
  // counted[i] false: a copy whose gradient another pipeline stage counts in the norm (empty: all count);
  // stages: the communicator over the pipeline stages (null: one stage); expert[i]: params[i] is one of this
  // rank's experts (empty: none), partitioned over expert_dp (null: held whole, no other rank owns it).
  // Collective-free; every data-parallel rank must construct it over the same shapes.
  ZeroOptimizer(std::vector<torch::Tensor> params, const std::vector<bool>& decay, const std::vector<bool>& split,
                const OptimizerOptions& options, Communicator& dp, TensorParallelGroup tp,
                std::vector<bool> counted = {}, Communicator* stages = nullptr, std::vector<bool> expert = {},
                Communicator* expert_dp = nullptr);
  ~ZeroOptimizer();

  // One step from the parameters' accumulated local gradients (each already multiplied by the rank's share
  // weight): reduce-scatter scaled by local_norm / global_norm, clip to max_norm (<= 0: no clipping),
  // AdamW at lr, all-gather into the parameters. `units` and `loss_sum` are this rank's token (or row)
  // count and weighted loss sum; they come back summed over ranks. Returns the global gradient norm before
  // clipping; a non-finite norm leaves every parameter and the optimizer state untouched.
  double step(double lr, double max_norm, double local_norm, bool mean, double& units, double& loss_sum);

  // Adam's state of one parameter, whole (its tensor-parallel shard's shape), in fp32.
  struct Moments {
    torch::Tensor exp_avg, exp_avg_sq;  // undefined before the first step
    int64_t step = 0;                   // Adam's step count (bias correction)
  };
  // Every parameter's moments, assembled from the partitions (collective over dp: an all-gather per group
  // and moment; the experts' over expert_dp).
  std::vector<Moments> gather_moments() const;
  // Takes this rank's partition of every parameter's moments (moments[i] for params[i]; undefined tensors
  // start from zeros) and re-reads the fp32 master partition from the parameters. Collective-free.
  void set_moments(const std::vector<Moments>& moments);

  // Elements of optimizer state on this rank: Adam's two moments plus the fp32 master partition.
  int64_t state_numel() const;
  int64_t partition_numel() const;

 private:
  struct Group;
  std::vector<torch::Tensor> params_;
  Communicator& dp_;
  TensorParallelGroup tp_;
  Communicator* stages_;
  std::vector<std::unique_ptr<Group>> groups_;
  std::unique_ptr<torch::optim::AdamW> adam_;
};

}  // namespace hybridflow
