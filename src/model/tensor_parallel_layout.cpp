#include "hybridflow/model/tensor_parallel_layout.h"

#include <cctype>

#include "hybridflow/core/error.h"
#include "hybridflow/model/transformer.h"

namespace hybridflow {
namespace {

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Whether `name` lies in a mixture-of-experts layer's sparse block ("model.layers.<i>.<block>.", the layer
// sparse by the config): router, experts and shared expert, all kept whole on every tensor-parallel rank.
bool in_sparse_block(const std::string& name, const ModelConfig& c) {
  if (c.num_moe_layers() == 0) return false;
  const std::string layers = "layers.";
  const size_t at = name.find(layers);
  if (at == std::string::npos) return false;
  size_t end = at + layers.size();
  int64_t layer = 0;
  for (; end < name.size() && std::isdigit(static_cast<unsigned char>(name[end])); ++end)
    layer = layer * 10 + (name[end] - '0');
  const std::string block = std::string(".") + c.moe_block_name() + ".";
  return end > at + layers.size() && c.moe_layer(layer) && name.compare(end, block.size(), block) == 0;
}

}  // namespace

void check_tensor_parallel(const ModelConfig& c, int tp) {
  HF_CHECK(tp >= 1, "tensor-parallel size must be >= 1, got ", tp);
  if (tp == 1) return;
  auto divides = [&](int64_t value, const char* key) {
    HF_CHECK(value % tp == 0, "config.json: ", key, " = ", value, " does not divide by tensor_model_parallel_size ",
             tp, "; choose a tensor-parallel size that divides it");
  };
  divides(c.num_attention_heads, "num_attention_heads");
  divides(c.intermediate_size, "intermediate_size");
  divides(c.vocab_size, "vocab_size");
  HF_CHECK(c.num_key_value_heads % tp == 0 || tp % c.num_key_value_heads == 0, "config.json: num_key_value_heads = ",
           c.num_key_value_heads, " and tensor_model_parallel_size ", tp,
           ": one must divide the other (KV heads are split, or replicated when there are fewer than ranks)");
}

bool kv_heads_replicated(const ModelConfig& c, int tp) { return tp > 1 && c.num_key_value_heads < tp; }

ShardDim shard_dim(const std::string& name, const ModelConfig& c, int tp) {
  if (tp == 1 || contains(name, "norm") || name.ends_with("score.weight") || in_sparse_block(name, c))
    return ShardDim::kReplicated;
  // LoRA adapters split with their base weight: a row-parallel base's A by its input columns (B whole), a
  // column-parallel base's B by its output rows (A whole).
  const bool lora_a = contains(name, ".lora_A."), lora_b = contains(name, ".lora_B.");
  if (contains(name, "o_proj") || contains(name, "down_proj"))
    return name.ends_with(".weight") && !lora_b ? ShardDim::kColumns : ShardDim::kReplicated;
  if (lora_a) return ShardDim::kReplicated;
  if ((contains(name, "k_proj") || contains(name, "v_proj")) && kv_heads_replicated(c, tp)) return ShardDim::kReplicated;
  return ShardDim::kRows;  // embeddings, lm_head, q/k/v, gate/up
}

torch::Tensor shard_of(const torch::Tensor& full, ShardDim dim, int rank, int size) {
  if (dim == ShardDim::kReplicated || size == 1) return full;
  const int64_t axis = dim == ShardDim::kRows ? 0 : 1;
  const auto part = even_partition(full.size(axis), size, rank, "the split dimension");
  return full.narrow(axis, part.start, part.length);
}

torch::Tensor checkpoint_shard(const std::string& name, const torch::Tensor& full, const ModelConfig& config,
                               const TensorParallelGroup& tp) {
  const ShardDim dim = shard_dim(name, config, tp.size());
  if (dim == ShardDim::kReplicated) return full;
  const int64_t axis = dim == ShardDim::kRows ? 0 : 1;
  if (full.dim() <= axis || full.size(axis) % tp.size() != 0) return full;
  return shard_of(full, dim, tp.rank(), tp.size());
}

void load_full_state(CausalLMImpl& model, const std::map<std::string, torch::Tensor>& full) {
  torch::NoGradGuard no_grad;
  const auto& tp = model.tensor_parallel();
  for (auto& item : model.named_parameters()) {
    auto found = full.find(item.key());
    HF_CHECK(found != full.end(), "load_full_state: no tensor '", item.key(), "'");
    auto shard = shard_of(found->second, shard_dim(item.key(), model.config(), tp.size()), tp.rank(), tp.size());
    HF_CHECK(shard.sizes() == item.value().sizes(), "load_full_state: '", item.key(), "' has shape ",
             found->second.sizes(), ", which gives a shard of ", shard.sizes(), " where this rank holds ",
             item.value().sizes());
    item.value().copy_(shard);
  }
}

std::map<std::string, torch::Tensor> gather_full_tensors(const std::map<std::string, torch::Tensor>& shards,
                                                         const ModelConfig& config, const TensorParallelGroup& tp) {
  torch::NoGradGuard no_grad;
  std::map<std::string, torch::Tensor> out;
  for (const auto& [name, shard] : shards) {
    const ShardDim dim = shard_dim(name, config, tp.size());
    torch::Tensor value = shard.detach();
    if (dim == ShardDim::kReplicated || !tp.enabled())
      out[name] = value.clone();
    else
      out[name] = tp.comm()->all_gather_cat(value.contiguous(), dim == ShardDim::kRows ? 0 : 1);
  }
  return out;
}

std::map<std::string, torch::Tensor> gather_full_state(const CausalLMImpl& model) {
  std::map<std::string, torch::Tensor> shards;
  for (const auto& item : model.named_parameters()) shards.emplace(item.key(), item.value());
  return gather_full_tensors(shards, model.config(), model.tensor_parallel());
}

}  // namespace hybridflow
