// Which parameters of a CausalLM tensor parallelism splits, along which dimension (Megatron's layout):
//   vocabulary-parallel: model.embed_tokens.weight, lm_head.weight            rows (vocabulary) split
//   column-parallel:     q/k/v_proj (weights and biases), mlp gate/up_proj   rows (output features) split
//   row-parallel:        o_proj.weight, mlp down_proj.weight                   columns (input features) split
//   replicated:          norms, o_proj.bias, score.weight (value head), MoE layers' sparse blocks (whole)
//   LoRA adapters:       a column-parallel base's lora_B rows split and lora_A replicated; a row-parallel
//                        base's lora_A columns split and lora_B replicated (model/lora_branch.h)
// Grouped-query attention with fewer KV heads than tensor ranks (tp % kv == 0) replicates k/v_proj: every
// rank computes all KV heads and uses the one its query heads share.
//
// A full (Hugging Face) tensor maps onto a rank's shard by narrowing one dimension, so a checkpoint loads
// into any layout, and the shards concatenate back into the full tensor for saving.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>

#include "hybridflow/model/model_config.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

class CausalLMImpl;

enum class ShardDim { kReplicated, kRows, kColumns };

// Throws naming the config key and the size when `config` cannot be split over tp_size ranks.
void check_tensor_parallel(const ModelConfig& config, int tp_size);
// True when k/v_proj are replicated (num_key_value_heads < tp_size).
bool kv_heads_replicated(const ModelConfig& config, int tp_size);
// The split of a parameter (its Hugging Face name) over tp_size ranks.
ShardDim shard_dim(const std::string& name, const ModelConfig& config, int tp_size);
// Rank `rank`'s shard of a full tensor (a view; the caller copies it).
torch::Tensor shard_of(const torch::Tensor& full, ShardDim dim, int rank, int size);
// This rank's shard of the full tensor a checkpoint holds under `name` (a view), or `full` itself when its
// shape cannot be split over the group, so that the caller's shape check names the mismatch.
torch::Tensor checkpoint_shard(const std::string& name, const torch::Tensor& full, const ModelConfig& config,
                               const TensorParallelGroup& tp);

// Copies every parameter's shard from full tensors named as Hugging Face names them. Throws naming a
// missing tensor or a shape that does not fit.
void load_full_state(CausalLMImpl& model, const std::map<std::string, torch::Tensor>& full);
// The full tensors of a tensor-parallel model, gathered over its group (collective: every rank of the
// group calls it); one process returns copies of its parameters.
std::map<std::string, torch::Tensor> gather_full_state(const CausalLMImpl& model);
// The same for any tensors shaped and named like the model's parameters (their optimizer moments, say):
// every rank of tp passes the same names in the same order. A split name's shards are concatenated; a
// replicated one is copied from this rank.
std::map<std::string, torch::Tensor> gather_full_tensors(const std::map<std::string, torch::Tensor>& shards,
                                                         const ModelConfig& config, const TensorParallelGroup& tp);

}  // namespace hybridflow
