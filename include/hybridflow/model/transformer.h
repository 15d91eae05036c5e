// Llama / Qwen2 decoder-only transformer: embedding, RMSNorm, rotary embeddings, grouped-query
// attention with a KV cache, SwiGLU MLP, and either a language-model head or a scalar value head.
// Parameter names equal Hugging Face's ("model.layers.0.self_attn.q_proj.weight", "lm_head.weight",
// value heads: "score.weight"), so a state dict maps one to one onto safetensors.
//
// Given a tensor-parallel group of t ranks, each rank builds only its shards (tensor_parallel_layout.h):
// 1/t of the attention heads and MLP features and 1/t of the vocabulary, and forward() returns this rank's
// vocabulary slice of the logits. Hidden states and values are replicated on every rank.
//
// Given a pipeline stage (pipeline_parallel.h), the model holds only that stage's decoder layers, under
// their global names; the embedding lives on the first stage and the final norm and head on the last (a
// tied lm_head keeps a copy of model.embed_tokens.weight there, whose gradient the training engine sums
// with the first stage's). A later stage's forward starts from the hidden states set_stage_input() gave
// it; a stage before the last returns its last layer's output for the next stage. The model never talks to
// other stages itself: the engine (engine/pipeline.h) moves activations and gradients between them.
#pragma once

#include <torch/torch.h>

#include <map>
#include <memory>
#include <vector>

#include "hybridflow/model/lora_config.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/moe.h"
#include "hybridflow/parallel/expert_parallel.h"
#include "hybridflow/parallel/pipeline_parallel.h"
#include "hybridflow/parallel/sequence_parallel.h"
#include "hybridflow/model/rotary.h"
#include "hybridflow/parallel/tensor_parallel.h"

namespace hybridflow {

namespace batch_invariant {
struct Tokens;
}
struct SlotAccess;  // where a decode step writes and reads each row's keys and values (transformer.cpp)
namespace fused_decode {
struct BlockTables;
}

// Keys and values of every layer for a batch being decoded. Each layer's tensors are slabs
// [batch, kv_heads, room, head_dim] whose first length() positions are filled: a step writes its keys in
// place instead of concatenating (which copied the whole cache every token).
//
// Continuous batching (decode_slots) uses the slabs as slots instead: each row of a slab holds one
// sequence from position 0, without padding, and its own length is kept by the caller; `filled` is unused.
struct KVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  // Positions to allocate when a slab is first made (generation sets prompt + new tokens); a forward that
  // needs more grows the slab by doubling, so 0 still works.
  int64_t capacity = 0;
  int64_t filled = 0;
  // Under expert parallelism with the experts split (not gathered): the caller runs every rank of the group
  // through the same forwards in step (engine/generation_static.cpp), so the MoE layers may exchange tokens.
  bool expert_parallel_lockstep = false;
  int64_t length() const { return filled; }
  // Keeps only the given batch rows (used when finished sequences leave the batch).
  void select_rows(const torch::Tensor& rows);
};

// A paged KV cache (continuous batching with paged_kv_cache; engine/block_manager.h keeps which blocks a
// sequence holds): per layer a pool of blocks [num_blocks, kv_heads, block_size, head_dim], where position p of
// a sequence with block table `table` lives in block table[p / block_size] at offset p % block_size. The
// caller makes the pools (zeros: a decode step may read blocks past a row's length, masked, and 0 x NaN would
// still be NaN) from the shapes of a first prefill.
struct PagedKVCache {
  std::vector<torch::Tensor> keys;
  std::vector<torch::Tensor> values;
  int64_t block_size() const { return keys.empty() ? 0 : keys.front().size(2); }
  // The bytes of one block over every layer, keys and values.
  int64_t block_bytes() const;
  // Copies block `from` into block `to` in every layer (copy on write of a shared block).
  void copy_block(int64_t from, int64_t to);
  // Writes positions [starts[i], lengths[i]) of prefill row i (a KVCache that hidden_states() filled, this
  // stage's layers; sequence position p is slab position p + shifts[i]) into the blocks of tables[i], every
  // layer. No starts: from position 0; no shifts: 0 (shifted rows: a batch whose cached prefixes were
  // left-padded to the longest).
  void write_prefill(const KVCache& prefill, const std::vector<std::vector<int64_t>>& tables,
                     const std::vector<int64_t>& lengths, const std::vector<int64_t>& starts = {},
                     const std::vector<int64_t>& shifts = {});
  // Row r's positions [0, lengths[r]) out of the blocks of tables[r], every layer, as a KVCache that
  // hidden_states() extends: slabs [rows, kv_heads, capacity, head_dim], filled = the longest length, each row's
  // positions ending there (left-padded with zeros, which the caller masks) and the room past it left for the
  // forward's new keys (capacity >= the longest; a prefill of new_ids fills it when capacity is longest +
  // new_ids, so nothing is copied again). For prefills of only the tokens after cached prefixes (multi-turn
  // resume), whose new keys write_prefill then stores with shifts longest - lengths[r].
  KVCache gather(const std::vector<std::vector<int64_t>>& tables, const std::vector<int64_t>& lengths,
                 int64_t capacity) const;
};

enum class HeadKind { kLanguageModel, kValue };

struct ForwardOutput {
  torch::Tensor logits;  // [batch, seq, vocab] for kLanguageModel (vocab / t under tensor parallelism)
  torch::Tensor values;  // [batch, seq] for kValue
};

class CausalLMImpl : public torch::nn::Module {
 public:
  // Throws naming the config key when the model does not split over tp's ranks (MoE sparse blocks stay whole).
  CausalLMImpl(const ModelConfig& config, HeadKind head = HeadKind::kLanguageModel, TensorParallelGroup tp = {},
               PipelineStage pp = {});

  // input_ids [B, T] int64. attention_mask [B, T_total] (1 = real token, 0 = padding), where
  // T_total = cache length + T; covers left and right padding. position_ids [B, T] int64; when
  // undefined they are derived from attention_mask (cumsum - 1, clamped at 0).
  // With a cache, appends this step's keys/values to it (this stage's layers only).
  // Packed rows (padding-free, engine/packed_rows.h; no cache): attention_mask values 1, 2, ... number the
  // sequences laid end to end in a row; a token attends only to earlier tokens of its own sequence, and
  // positions, when not given, restart at 0 with each. A single packed row attends sequence by sequence
  // (the sum of their squared lengths, not the square of the row's); several rows use a block-diagonal mask.
  ForwardOutput forward(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                        const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);

  // forward() in two halves, so callers that need only some positions (generation's last token, an
  // actor's response tokens) skip the [B, T, vocab] logits of the rest: hidden_states() returns the final
  // normed hidden states [B, T, hidden]; apply_head() maps [..., hidden] to logits or values (float32).
  torch::Tensor hidden_states(const torch::Tensor& input_ids, const torch::Tensor& attention_mask,
                              const torch::Tensor& position_ids = {}, KVCache* cache = nullptr);
  ForwardOutput apply_head(const torch::Tensor& hidden);
  // Logits over the whole vocabulary (gathered over the tensor-parallel group): for sampling the next token
  // from [rows, hidden], never for every position.
  torch::Tensor full_vocab_logits(const torch::Tensor& hidden);
  // The language-model head's weight [V / t, hidden] (the embedding's when tied), for callers that apply
  // the head themselves a chunk at a time (engine/head_log_probs.h).
  torch::Tensor lm_head_weight() const;

  // Activation checkpointing (verl's enable_gradient_checkpointing): while training with gradients, each
  // decoder layer keeps only its input and recomputes its activations in the backward pass
  // (activation_checkpoint.h). Gradients are unchanged; memory falls from every layer's activations to
  // one layer's, for about one more forward pass of time.
  void set_gradient_checkpointing(bool on) { gradient_checkpointing_ = on; }
  bool gradient_checkpointing() const { return gradient_checkpointing_; }

  // Continuous batching's decode step: one token per row (input_ids [rows, 1]), row r at position lengths[r]
  // of its own slot slots[r] of `cache` (slabs [slots, kv_heads, capacity, head_dim], allocated and
  // prefilled by the caller): it writes its key and value there and attends to that slot's positions
  // [0, lengths[r]]. Rows need not be in slot order and slots may sit idle. Returns hidden_states()'s
  // output, [rows, 1, hidden]. On the CPU in float32 without tensor parallelism the layers run as fused
  // kernels (model/fused_decode.h) when gradients are off.
  torch::Tensor decode_slots(const torch::Tensor& input_ids, const std::vector<int64_t>& slots,
                             const std::vector<int64_t>& lengths, KVCache& cache);
  // The same step on a paged cache: row r writes position lengths[r] and attends to [0, lengths[r]] through
  // the blocks of tables[r] (which must cover position lengths[r]). Same kernels, same arithmetic: for
  // equal cache contents, the same hidden states as decode_slots.
  torch::Tensor decode_paged(const torch::Tensor& input_ids, const std::vector<std::vector<int64_t>>& tables,
                             const std::vector<int64_t>& lengths, PagedKVCache& cache);

  // The paged step on device tensors alone, with no host read and no check (CUDA graphs capture it,
  // engine/decode_graphs.h): input_ids [rows, 1], tables [rows, width] and lengths [rows], int64 on the model's
  // device, each row's table covering its positions [0, lengths[r]]; `span` <= width x block size positions
  // attended (those past a row's length masked); the rotary frequencies already on the device. The same
  // operators as decode_paged off the fused kernels.
  torch::Tensor decode_paged_on_device(const torch::Tensor& input_ids, const torch::Tensor& tables,
                                       const torch::Tensor& lengths, int64_t span, const RotaryFrequencies& rotary,
                                       PagedKVCache& cache);
  // Whether decode_paged_on_device applies to this model now: one rank and one stage, dense layers, no unmerged
  // LoRA adapters, no dynamic RoPE scaling (its frequencies follow the longest position), not batch-invariant,
  // no router recording.
  bool decodes_on_device() const;
  // Whether decode_paged_on_device runs the fused decode kernels on `cache` (a CUDA device, a supported dtype
  // and shape), whose attention reads each row's own positions only: a span past the rows' lengths then costs
  // empty partitions, not masked reads.
  bool decode_attends_row_lengths(const PagedKVCache& cache) const;

  // Pipeline stages after the first: the hidden states [B, T, hidden] entering this stage's first layer,
  // used by (and cleared by) the next forward; under sequence parallelism this rank's slice [B, T' / n, hidden]
  // of the sequence padded to T'.
  void set_stage_input(const torch::Tensor& hidden) { stage_input_ = hidden; }
  // The activation this stage receives or sends for input_ids of [batch, seq]: shape and dtype (a slice of the
  // sequence under sequence parallelism).
  torch::Tensor stage_activation_like(int64_t batch, int64_t seq) const;

  // LoRA (model/lora.h): adds adapters to the projections `lora` targets, each A drawn from a generator
  // seeded by `seed` and the projection's place in the whole model (so every pipeline and tensor-parallel
  // layout holds the adapters one process draws; under tensor parallelism A and B split with the base weight,
  // model/lora_branch.h), B zeros, and freezes every other parameter. Once per model; errors name
  // lora_rank / target_modules.
  void add_lora(const LoraConfig& lora, uint64_t seed = 0);
  bool has_lora() const { return lora_added_; }
  const LoraConfig& lora_config() const { return lora_; }
  // Disabled adapters leave the base model (the reference policy without a second copy). Not while merged.
  void set_lora_enabled(bool enabled);
  bool lora_enabled() const { return lora_enabled_; }
  // Adds scaling * B A into each adapted weight (generation without the branches' extra matmuls);
  // unmerge_lora() restores the weights bit for bit from copies kept meanwhile.
  void merge_lora();
  void unmerge_lora();
  bool lora_merged() const { return lora_merged_; }

  // Mixture of experts (model/moe.h). Router replay: with kRecord each forward, and each decode step
  // (decode_slots / decode_paged: [rows, 1, k] per layer), keeps every token's experts in every MoE layer of
  // this stage (recorded_routing()); with kReplay, for whole-sequence forwards only, each forward routes by
  // `replay` (per MoE layer of this stage, [batch, seq, k] for that forward's input_ids; a pipeline stage also
  // takes the whole model's and keeps its own layers of it), weighting the replayed experts by the current
  // router's probabilities, and marks where the router itself would have chosen other experts
  // (replay_differs(), over this stage's layers).
  void set_router_replay(RouterReplayMode mode, ExpertRouting replay = {});
  // This stage's MoE layers as a range of the whole model's MoE layers (all of them without stages).
  Partition stage_moe_layers() const;
  RouterReplayMode router_replay_mode() const { return router_replay_; }
  const ExpertRouting& recorded_routing() const { return recorded_routing_; }
  // kReplay: [batch, seq] bool of the last forward, true where some layer's own top k differs from the replay.
  const torch::Tensor& replay_differs() const { return replay_differs_; }
  // The load-balancing loss: while kept, each forward keeps its MoE layers' router logits (with their graph,
  // so sparse layers are not activation-checkpointed) and load_balancing_loss() gives transformers'
  // auxiliary loss of the last forward over its unpadded tokens, before router_aux_loss_coef. Not per stage.
  void set_keep_router_logits(bool keep);
  bool keeps_router_logits() const { return keep_router_logits_; }
  bool has_router_logits() const { return !router_logits_.empty(); }
  torch::Tensor load_balancing_loss() const;

  // Ulysses sequence parallelism (parallel/sequence_parallel.h): whole-sequence forwards (not those with a
  // KV cache) run each rank's slice of the sequence through the layers and return the whole sequence's hidden
  // states on every rank of the group (pipeline stages before the last pass their slice on); average the
  // gradients over the group after backward. Every rank of the group gets the same inputs. Under tensor
  // parallelism the group splits this rank's heads, and the group's ranks are of one tensor-parallel rank.
  // Mixture-of-experts layers route each rank's slice (under expert parallelism, exchanged with the expert group
  // as any rows are); the recorded routing and the router logits cover the whole sequence. Throws naming
  // ulysses_sequence_parallel_size when the group does not split the query heads evenly or the KV heads into
  // whole heads (a KV head is repeated where there are fewer than ranks).
  void set_sequence_parallel(SequenceParallelGroup sp);
  const SequenceParallelGroup& sequence_parallel() const { return sp_; }

  // Expert parallelism (parallel/expert_parallel.h): each MoE layer keeps num_experts / n of its experts (under
  // their checkpoint names) and exchanges tokens with the group around them; every rank of the group runs its own
  // rows, and every forward and backward is collective over the group (under tensor parallelism: the replicas of
  // one tensor-parallel rank; experts stay whole per rank; under sequence parallelism each rank's rows are its
  // slice of the sequence). With `over_tensor_parallel` the group holds this model's tensor-parallel ranks
  // (Megatron's experts folded over them, expert_tensor_parallel_size 1): they hold the same tokens and split
  // them between them around each exchange, so each expert's work is done once. Once, before an optimizer sees
  // the parameters. Throws naming expert_model_parallel_size when n does not divide the experts.
  void set_expert_parallel(ExpertParallelGroup ep, bool over_tensor_parallel = false);
  const ExpertParallelGroup& expert_parallel() const { return ep_; }
  // Collective over the group: every expert in this process, without gradients, until release_gathered_experts();
  // meanwhile forwards run alone (generation, whose ranks take different numbers of steps; checkpoint saving).
  // This rank's own experts become slices of the gathered set (nothing is held twice) and return to memory of
  // their own, bit for bit, on release. Returns what it moved (nothing when not split or already gathered).
  // Experts folded over exactly the tensor-parallel ranks need no gather to run and are left alone unless
  // `even_when_folded` (copying every expert out: weight sync to a rollout pool); no forward runs meanwhile.
  ExpertGather gather_experts(bool even_when_folded = false);
  void release_gathered_experts();
  bool experts_gathered() const { return experts_gathered_; }
  // While gathered: every expert weight of this process's MoE layers by its parameter name
  // ("model.layers.3.mlp.experts.5.up_proj.weight"), the other ranks' included (which named_parameters() leaves
  // out), as views of the gathered set. Throws unless gathered.
  std::map<std::string, torch::Tensor> gathered_expert_weights() const;
  // Whether the expert-parallel group is exactly this model's tensor-parallel group (experts folded over it, one
  // replica): its ranks run every forward together anyway, so the experts stay where they are for generation and
  // the no-gradient passes, and gather_experts() moves nothing.
  bool experts_follow_tensor_parallel() const { return ep_.enabled() && ep_over_tp_ && ep_.size() == tp_.size(); }
  // Whether a forward needs the expert-parallel group's other ranks in step with this one (experts split, not
  // gathered, and not folded over exactly the tensor-parallel ranks, which run every forward together anyway).
  bool experts_need_lockstep() const {
    return ep_.enabled() && !experts_gathered_ && !experts_follow_tensor_parallel();
  }

  const ModelConfig& config() const { return config_; }
  HeadKind head_kind() const { return head_; }
  const TensorParallelGroup& tensor_parallel() const { return tp_; }
  const PipelineStage& pipeline_stage() const { return pp_; }
  // The global indices of the decoder layers this stage holds.
  Partition stage_layers() const { return layer_range_; }

 private:
  ModelConfig config_;
  HeadKind head_;
  TensorParallelGroup tp_;
  PipelineStage pp_;
  SequenceParallelGroup sp_;
  ExpertParallelGroup ep_;
  bool experts_gathered_ = false;
  bool ep_over_tp_ = false;
  Partition layer_range_;
  torch::Tensor stage_input_;
  bool gradient_checkpointing_ = false;
  LoraConfig lora_;
  bool lora_added_ = false, lora_enabled_ = true, lora_merged_ = false;
  RouterReplayMode router_replay_ = RouterReplayMode::kOff;
  ExpertRouting replay_routing_, recorded_routing_;
  torch::Tensor replay_differs_;
  bool keep_router_logits_ = false;
  std::vector<torch::Tensor> router_logits_;
  torch::Tensor router_logits_mask_;
  // Whether forward must add the adapters' branches (the fused decode kernels do not know them).
  bool lora_branches_active() const { return lora_added_ && lora_enabled_ && !lora_merged_; }
  // decode_slots and decode_paged: row r's position p is in block tables[r * width + p / block_size] of the
  // per-layer pools (a slot cache is width 1, block_size = capacity, the slots as tables).
  torch::Tensor decode_blocks(const torch::Tensor& input_ids, const std::vector<int64_t>& tables, int64_t width,
                              int64_t block_size, const std::vector<int64_t>& lengths, std::vector<torch::Tensor>& keys,
                              std::vector<torch::Tensor>& values, const char* caller);
  // The tensor-operator decode step after the checks: this stage's layers over h [rows, 1, hidden] with the
  // rotary cos/sin [rows, 1, 1, head_dim], the additive mask [rows, 1, 1, span] and where each row writes and
  // reads its keys and values (every index on the device), then the final norm on the last stage.
  torch::Tensor decode_layers(torch::Tensor h, const torch::Tensor& cos, const torch::Tensor& sin,
                              const torch::Tensor& mask_bias, const SlotAccess& access, std::vector<torch::Tensor>& keys,
                              std::vector<torch::Tensor>& values);
  // The batch-invariant forward (model/batch_invariant.h): throws naming the key where the mode does not apply;
  // runs this stage's layers over `tokens` (and the final norm on the last stage).
  void check_batch_invariant(const char* what) const;
  torch::Tensor batch_invariant_layers(const torch::Tensor& h, const batch_invariant::Tokens& tokens,
                                       std::vector<torch::Tensor>& keys, std::vector<torch::Tensor>& values,
                                       const fused_decode::BlockTables& tables);
  torch::Tensor batch_invariant_hidden_states(const torch::Tensor& h, const torch::Tensor& mask,
                                              const torch::Tensor& positions, int64_t past, KVCache* cache);
  // Submodules registered under Hugging Face names; see transformer.cpp.
  struct Layers;
  std::shared_ptr<Layers> layers_;
};
TORCH_MODULE(CausalLM);

// Position ids from a [B, T] attention mask: cumulative count of real tokens minus one, 0 on padding.
torch::Tensor position_ids_from_mask(const torch::Tensor& attention_mask);

}  // namespace hybridflow
