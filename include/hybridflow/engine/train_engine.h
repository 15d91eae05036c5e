// Training engine for one model replica: AdamW (no weight decay on norms and biases), global-norm
// gradient clipping, a warm-up + decay learning-rate schedule, micro-batch gradient accumulation
// and optimizer state checkpoints. Actors, critics, reward models and SFT all train through it.
//
// Mixed precision: when the module's parameters are bf16 (or fp16), the engine keeps fp32 master copies
// that AdamW owns (so its moments are fp32 too), accumulates every micro-batch's gradient into the
// masters' fp32 gradients, clips, reduces and steps in fp32, and writes the rounded result back into the
// module. Forward and backward run in the module's dtype; losses are the caller's (fp32 by convention).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/engine/lr_schedule.h"
#include "hybridflow/parallel/expert_parallel.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

class Communicator;
class PipelineStageRunner;
class ZeroOptimizer;

struct OptimizerOptions {
  LrSchedule schedule;
  double weight_decay = 0.01;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double grad_clip = 1.0;  // max global gradient norm; <= 0 disables clipping (the norm is still reported)
};

// AdamW's (beta1, beta2) from a config list, checked: two values in [0, 1). `key` names the list in the error.
void set_adam_betas(OptimizerOptions& options, const std::vector<double>& betas, const std::string& key);

// Norm weights, biases and any parameter with fewer than 2 dims are not weight-decayed (as in verl / HF).
bool excluded_from_weight_decay(const std::string& name, const torch::Tensor& param);

struct StepStats {
  int64_t step = 0;         // optimizer steps taken so far, this one included
  double loss = 0;          // token-weighted mean loss over the mini-batch
  double grad_norm = 0;     // global norm before clipping
  double lr = 0;            // learning rate used by this step
  int64_t tokens = 0;       // tokens (mask sum) or rows that the loss averaged over
  int64_t micro_batches = 0;
  bool skipped = false;     // the gradient was not finite; parameters left unchanged
  bool empty = false;       // no token to learn from (every one rejected): no step, parameters left unchanged
  // Mixture of experts with router_aux_loss_coef > 0: this rank's load-balancing loss (before the
  // coefficient; the coefficient times it is in `loss`), weighted over micro-batches as the loss is.
  double moe_aux_loss = 0;
  bool has_moe_aux_loss = false;
};

// Returns the mean loss over the micro-batch's tokens (those where the mask is 1), as a scalar
// with a gradient. The engine weights each micro-batch by its share of the mini-batch's tokens,
// so the accumulated gradient equals that of the full-batch mean.
using MicroLossFn = std::function<torch::Tensor(const DataProto& micro_batch)>;

// How micro-batch losses combine into the mini-batch's loss, so that splitting a mini-batch (into
// micro-batches, or across data-parallel ranks) does not change the gradient.
enum class LossWeighting {
  kAuto,       // kTokenMean when the mini-batch has the token mask, else kRowMean
  kTokenMean,  // each loss is a mean over its valid tokens: weight by token count (token-mean)
  kRowMean,    // a mean over its rows (the seq-mean modes): weight by the rows that have a valid token
               // (all rows when the mini-batch has no token mask)
  kSum,        // already a plain sum (token-sum): every micro-batch weighs 1
};

// Sums a flat fp32 buffer in place over the data-parallel ranks (e.g. Communicator::all_reduce). Every
// rank must call it the same number of times with the same buffer size.
using GradientReducer = std::function<void(torch::Tensor& flat)>;

class TrainEngine {
 public:
  // The module must stay alive as long as the engine.
  TrainEngine(std::shared_ptr<torch::nn::Module> module, OptimizerOptions options);
  ~TrainEngine();

  // One optimizer step on `mini_batch`, split into micro-batches of `micro_batch_size` rows (the last
  // may be smaller). Token shares come from tensor `token_mask_key` when present, else rows count.
  // With a gradient reducer, mini_batch is this rank's share of the global mini-batch: the gradients
  // (and the loss and token count) are summed over ranks with the same weighting before clipping, so
  // every rank takes the step one process would take on the whole mini-batch.
  StepStats train_step(const DataProto& mini_batch, int64_t micro_batch_size, const MicroLossFn& loss_fn,
                       const std::string& token_mask_key = "loss_mask",
                       LossWeighting weighting = LossWeighting::kAuto);
  // The same step over micro-batches the caller formed, e.g. by token count and trimmed of padding
  // (token_micro_batches.h): together they must hold the mini-batch's rows, each once. Each loss is still
  // weighted by its micro-batch's share of the mini-batch's units, so how the rows are grouped changes
  // the step only by float rounding.
  StepStats train_step(const std::vector<DataProto>& micro_batches, const MicroLossFn& loss_fn,
                       const std::string& token_mask_key = "loss_mask",
                       LossWeighting weighting = LossWeighting::kAuto);

  // Data-parallel training: set on every rank of the group (an empty function = one process).
  void set_gradient_reducer(GradientReducer reducer) { reducer_ = std::move(reducer); }
  bool data_parallel() const { return static_cast<bool>(reducer_) || zero_ != nullptr; }
  // Data parallelism over `dp` with the optimizer state partitioned over its ranks (ZeRO stage 1,
  // zero_optimizer.h) instead of a gradient reducer: same steps, 1/d of the Adam moments per rank. Call
  // on every rank of `dp` (which must outlive the engine), after set_tensor_parallel and set_pipeline,
  // before training. Checkpoint it with named_state / load_named_state (save_state refuses this mode).
  void set_sharded_optimizer(Communicator& dp);
  bool sharded_optimizer() const { return zero_ != nullptr; }
  // Elements of optimizer state this rank holds: Adam's moments (once they exist) and fp32 masters.
  int64_t optimizer_state_numel() const;
  // Moves Adam's moments, the fp32 master weights and their gradients to `device` (host memory between
  // updates, the parameters' device before the next: verl's optimizer_offload). The tensors keep their
  // identity, so the optimizer's references stay valid. Not with the ZeRO optimizer (Error).
  void move_optimizer_state(const torch::Device& device);
  // Tensor parallelism (set on every rank of the group): the parameters `is_split` names hold 1/t of a
  // tensor each, so their squared gradient norms are summed over the group; the others are replicated and
  // count once. Clipping then scales every rank's gradients by the same factor one process would use.
  void set_tensor_parallel(const TensorParallelGroup& tp, const std::function<bool(const std::string&)>& is_split);
  // Expert parallelism (parallel/expert_parallel.h; set on every rank, after the gradient reducer or the sharded
  // optimizer, which span the data-parallel ranks of which the expert-parallel group is a part): the parameters
  // `is_expert` names are this rank's experts. Each step first sums the mini-batch's units over the data-parallel
  // ranks, so that every micro-batch's loss is weighted by its share of the global mini-batch (an expert's
  // gradient gathers every rank's tokens through the exchanges' backward); the replicated parameters' gradients
  // are summed over the data-parallel ranks, the experts' over `expert_data_parallel` (the ranks owning the same
  // experts; null when no other rank does), and their squared norms over the expert-parallel group. With the
  // ZeRO optimizer the experts' gradients and state are partitioned over `expert_data_parallel` only (Megatron's
  // distributed optimizer). With pipeline stages every group is the stage's (its data-parallel ranks; the
  // experts of its layers), and the stages' norms add up; stages and the ZeRO optimizer together are refused.
  // Every rank must run as many micro-batches, each with a token (their passes are collective).
  void set_expert_parallel(const ExpertParallelGroup& ep, Communicator* expert_data_parallel,
                           const std::function<bool(const std::string&)>& is_expert);
  // Pipeline parallelism (set on every stage, after set_tensor_parallel): the module is one stage of a
  // CausalLM and train_step runs its micro-batches in 1F1B order (pipeline_parallel.h). The loss function
  // runs on the last stage only; every stage returns the same stats. Gradient norms are summed over the
  // stages and a tied embedding's gradient over the first and last. Data parallelism (a reducer over the
  // ranks of the same stage) combines with it, and so does the ZeRO optimizer (set after this).
  void set_pipeline(std::shared_ptr<PipelineStageRunner> pipeline);
  // Elements of the buffer each step reduces: every trainable parameter plus 2 (token count, loss).
  int64_t reduced_numel() const;

  // Pieces for callers that run their own accumulation loop.
  void zero_grad();
  // Returns the norm before clipping. Without tensor, expert or pipeline parallelism the clip's factor is
  // applied by the next apply_step, inside AdamW's pass (the gradients hold the clipped values after it);
  // otherwise the gradients are scaled here.
  double clip_grad_norm();
  void apply_step();  // sets this step's lr, steps AdamW (clipping first), advances the step counter

  int64_t step() const { return step_; }
  // True when the module trains in bf16/fp16 against fp32 master weights.
  bool mixed_precision() const { return !masters_.empty(); }
  double lr_for_next_step() const { return lr_at_step(options_.schedule, schedule_step_ >= 0 ? schedule_step_ : step_); }
  // Pins the LR schedule's position for the following optimizer steps (< 0: the optimizer step count,
  // the default). RL roles step their schedule once per update call, as verl does, however many
  // mini-batches and epochs the call holds.
  void set_schedule_step(int64_t step) { schedule_step_ = step; }
  const OptimizerOptions& options() const { return options_; }
  torch::optim::AdamW& optimizer() { return *optimizer_; }
  torch::nn::Module& module() { return *module_; }

  // AdamW moments, the step counter and (mixed precision) the fp32 master weights, written atomically
  // (temp file + rename), so a resumed bf16 run continues from the exact fp32 values.
  void save_state(const std::string& path) const;
  // Restores a state saved by an engine over the same module layout; errors name the file.
  void load_state(const std::string& path);

  // The optimizer state by parameter name, independent of how it is stored (plain AdamW, or partitioned
  // over data-parallel ranks by ZeRO): what a checkpoint needs to restore it into any layout.
  struct ParameterState {
    torch::Tensor exp_avg, exp_avg_sq;  // Adam's moments (undefined before the parameter's first step)
    torch::Tensor master;               // the fp32 master weight (mixed precision only)
    int64_t adam_step = 0;              // Adam's bias-correction step count
  };
  struct NamedState {
    int64_t step = 0;                                // optimizer steps taken (the LR schedule's position)
    std::map<std::string, ParameterState> parameters;  // by the module's parameter names; fp32, CPU
  };
  // Shapes are this rank's (a tensor-parallel shard's). Collective over the data-parallel group with ZeRO.
  NamedState named_state() const;
  // Restores from tensors in this rank's shapes; a parameter the state lacks starts its moments afresh.
  // Collective-free. Throws naming a parameter whose shape does not fit.
  void load_named_state(const NamedState& state);

 private:
  std::shared_ptr<torch::nn::Module> module_;
  OptimizerOptions options_;
  std::vector<torch::Tensor> params_;   // the module's trainable parameters, in its dtype
  std::vector<torch::Tensor> masters_;  // fp32 copies of params_ that the optimizer steps (mixed precision only)
  // What the optimizer, clipping and the gradient reduce work on: masters_ when mixed, else params_.
  std::vector<torch::Tensor>& optimized() { return masters_.empty() ? params_ : masters_; }
  const std::vector<torch::Tensor>& optimized() const { return masters_.empty() ? params_ : masters_; }
  // Mixed precision: adds the module's low-precision gradients into the masters' fp32 ones and clears them.
  void accumulate_into_masters();
  // train_step drops the gradients before its micro-batches instead of zeroing them, so autograd stores
  // the first micro-batch's gradient as it is instead of adding it into zeros (at 0.5 B parameters about
  // 6 GB less memory traffic a step; the sums are the same bits). After the backward passes
  // give_back_zero_grads hands zeros to the tensors that had a gradient before and got none this step, so
  // clipping, the reduce and AdamW see what zero_grad() would have left them (AdamW still decays them).
  void release_grads();
  void give_back_zero_grads();
  std::vector<bool> had_grad_;  // optimized()[i] has had a gradient
  float pending_grad_scale_ = 1;  // clip_grad_norm's factor, for the next apply_step
  // Sums the local gradients (scaled by local_norm), token count and loss over ranks; returns the
  // global normaliser's worth back into stats.
  // False when no rank's mini-batch holds a token: nothing to learn, the step is skipped.
  bool reduce_gradients(double local_norm, bool mean, StepStats& stats);

  // The global gradient norm over the tensor-parallel group and the pipeline stages. counted[i] false:
  // a copy whose gradient another stage already counts.
  // The whole norm of with_grad's gradients; keeps the clip's factor in pending_grad_scale_.
  double clip_factor_for_next_step(const std::vector<torch::Tensor>& with_grad, double max_norm);
  double model_parallel_norm(const std::vector<torch::Tensor>& with_grad, const std::vector<bool>& split,
                             const std::vector<bool>& expert, const std::vector<bool>& counted) const;
  // Runs the micro-batches through the pipeline in 1F1B order; returns the loss summed over the stages.
  void pipelined_backward(const std::vector<DataProto>& micro_batches, const std::vector<double>& weights,
                          const MicroLossFn& loss_fn, StepStats& stats);
  // Sums the tied embedding's gradient over the first and last stages.
  void reduce_tied_gradients();

  // The reduce-scatter, clip, partitioned AdamW and all-gather of a ZeRO step.
  void sharded_step(double local_norm, bool mean, StepStats& stats);
  // (Re)builds the ZeRO optimizer over zero_dp_ from the current layout flags (no state yet).
  void make_sharded_optimizer();

  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<ZeroOptimizer> zero_;
  int64_t step_ = 0;
  int64_t schedule_step_ = -1;
  GradientReducer reducer_;
  TensorParallelGroup tp_;
  std::vector<std::string> names_;  // of params_
  std::vector<bool> split_;         // params_[i] is a tensor-parallel shard
  ExpertParallelGroup ep_;
  Communicator* expert_dp_ = nullptr;
  Communicator* zero_dp_ = nullptr;  // set_sharded_optimizer's group
  std::vector<bool> expert_;        // params_[i] is one of this rank's experts
  std::shared_ptr<PipelineStageRunner> pipeline_;
};

}  // namespace hybridflow
