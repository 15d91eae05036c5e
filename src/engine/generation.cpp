// generate()'s entry: input checks, the choice of path, token sampling, and what both paths share
// (generation_steps.h).
#include "hybridflow/engine/generation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/decode_graph_obstacles.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/model/rms_norm.h"

namespace hybridflow {
namespace {

void check_config(const GenerationConfig& cfg, int64_t vocab_size) {
  HF_CHECK(cfg.max_new_tokens >= 0, "generation: max_new_tokens must be >= 0, got ", cfg.max_new_tokens);
  HF_CHECK(cfg.n >= 1, "generation: n (samples per prompt) must be >= 1, got ", cfg.n);
  HF_CHECK(cfg.greedy || cfg.temperature > 0, "generation: temperature must be > 0 when sampling, got ",
           cfg.temperature, " (set greedy for argmax decoding)");
  HF_CHECK(cfg.top_k >= 0, "generation: top_k must be >= 0 (0 = off), got ", cfg.top_k);
  HF_CHECK(cfg.top_p > 0 && cfg.top_p <= 1, "generation: top_p must be in (0, 1], got ", cfg.top_p);
  HF_CHECK(cfg.pad_token_id >= 0 && cfg.pad_token_id < vocab_size, "generation: pad_token_id ", cfg.pad_token_id,
           " is outside the vocabulary [0, ", vocab_size, ")");
  HF_CHECK(cfg.sampleable_vocab_size >= 0 && cfg.sampleable_vocab_size <= vocab_size,
           "generation: sampleable_vocab_size ", cfg.sampleable_vocab_size, " must be in [0, vocab_size = ", vocab_size,
           "] (0 = all)");
  HF_CHECK(cfg.max_num_seqs >= 0, "generation: max_num_seqs must be >= 0 (0 = every sequence at once), got ",
           cfg.max_num_seqs);
  HF_CHECK(cfg.admission_rows >= -1, "generation: admission_rows must be >= -1 (-1 = a quarter of the slots, 0 = "
           "a prompt joins as soon as its samples fit), got ", cfg.admission_rows);
  HF_CHECK(cfg.readback_interval >= 1, "generation: readback_interval must be >= 1 decode step, got ",
           cfg.readback_interval);
  HF_CHECK(cfg.max_num_batched_tokens >= 1, "generation: max_num_batched_tokens (positions one prefill forward may ",
           "hold) must be >= 1, got ", cfg.max_num_batched_tokens);
  HF_CHECK(cfg.kv_block_size >= 1, "generation: kv_block_size must be >= 1 token, got ", cfg.kv_block_size);
  HF_CHECK(cfg.kv_cache_blocks >= 0 && cfg.memory_budget_bytes >= 0,
           "generation: kv_cache_blocks and memory_budget_bytes must be >= 0 (0 = not set), got ", cfg.kv_cache_blocks,
           " and ", cfg.memory_budget_bytes);
}

// Restores train/eval mode on scope exit, also when generation throws.
class EvalModeGuard {
 public:
  explicit EvalModeGuard(CausalLM& model) : model_(model), was_training_(model->is_training()) { model_->eval(); }
  ~EvalModeGuard() { model_->train(was_training_); }
  EvalModeGuard(const EvalModeGuard&) = delete;
  EvalModeGuard& operator=(const EvalModeGuard&) = delete;

 private:
  CausalLM& model_;
  bool was_training_;
};

// Router recording for the scope of one generate() call; the model replays nothing afterwards, as before.
class RoutingRecordGuard {
 public:
  explicit RoutingRecordGuard(CausalLM& model) : model_(model) { model_->set_router_replay(RouterReplayMode::kRecord); }
  ~RoutingRecordGuard() { model_->set_router_replay(RouterReplayMode::kOff); }
  RoutingRecordGuard(const RoutingRecordGuard&) = delete;
  RoutingRecordGuard& operator=(const RoutingRecordGuard&) = delete;

 private:
  CausalLM& model_;
};

uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

}  // namespace

double sampling_uniform(uint64_t seed, int64_t sequence, int64_t step) {
  const uint64_t stream = splitmix64(seed ^ splitmix64(static_cast<uint64_t>(sequence)));
  // 32 bits: u <= 1 - 2^-32, so u x total stays below total in double and the draw never falls off the end.
  return static_cast<double>(splitmix64(stream + static_cast<uint64_t>(step)) >> 32) * 0x1p-32;
}

std::pair<torch::Tensor, torch::Tensor> sample_next_tokens(const torch::Tensor& logits, const GenerationConfig& cfg,
                                                           const std::vector<double>& uniforms) {
  torch::Tensor drawn_with;
  if (!cfg.greedy) {
    HF_CHECK(static_cast<int64_t>(uniforms.size()) == logits.size(0), "sample_next_tokens: ", uniforms.size(),
             " uniform numbers for ", logits.size(0), " rows");
    drawn_with = upload(torch::tensor(uniforms, torch::kFloat64), logits.device());
  }
  generation::TokenDraw draw = generation::draw_tokens(logits, cfg, drawn_with);
  generation::check_sampleable(draw.no_mass);
  return {draw.tokens, draw.log_probs};
}

namespace generation {

PromptBatch pad_prompts(const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& cfg,
                        torch::Device device) {
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t rows = static_cast<int64_t>(prompts.size()) * cfg.n;
  PromptBatch batch;
  for (const auto& p : prompts) batch.longest = std::max<int64_t>(batch.longest, static_cast<int64_t>(p.size()));
  batch.ids = torch::full({rows, batch.longest}, cfg.pad_token_id, i64);
  batch.mask = torch::zeros({rows, batch.longest}, i64);
  auto ids = batch.ids.accessor<int64_t, 2>();
  auto mask = batch.mask.accessor<int64_t, 2>();
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t offset = batch.longest - static_cast<int64_t>(prompts[i].size());
    for (int64_t j = 0; j < cfg.n; ++j)
      for (size_t t = 0; t < prompts[i].size(); ++t) {
        ids[static_cast<int64_t>(i) * cfg.n + j][offset + static_cast<int64_t>(t)] = prompts[i][t];
        mask[static_cast<int64_t>(i) * cfg.n + j][offset + static_cast<int64_t>(t)] = 1;
      }
  }
  batch.ids = upload(batch.ids, device);
  batch.mask = upload(batch.mask, device);
  return batch;
}

StageLink::StageLink(CausalLM& model, Communicator* stages)
    : model_(model), stages_(stages), stage_(&model->pipeline_stage()) {}

void StageLink::receive(int64_t rows, int64_t seq) {
  if (!stage_->enabled() || stage_->first()) return;
  torch::Tensor input = model_->stage_activation_like(rows, seq);
  stages_->recv(input, stage_->stage - 1);
  model_->set_stage_input(input);
}

void StageLink::send(const torch::Tensor& hidden) {
  if (stage_->enabled() && !stage_->last()) stages_->send(hidden.contiguous(), stage_->stage + 1);
}

void StageLink::share(torch::Tensor& tokens, torch::Tensor& log_probs, int64_t rows) {
  if (!stage_->enabled()) return;
  // Each stage needs the tokens for its next input and to keep its bookkeeping in step with the others.
  const torch::Device device = model_->parameters().front().device();
  torch::Tensor chosen = stage_->last()
                             ? torch::stack({tokens.to(torch::kFloat64), log_probs.to(torch::kFloat64)})
                             : torch::empty({2, rows}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
  stages_->broadcast(chosen, stage_->stages - 1);
  tokens = chosen[0].to(torch::kInt64);
  log_probs = chosen[1].to(torch::kFloat32);
}

torch::Tensor sampling_uniforms(const GenerationConfig& cfg, const std::vector<int64_t>& sequences,
                                const std::vector<int64_t>& first_steps, int64_t steps, torch::Device device) {
  return sampling_uniforms(std::vector<uint64_t>(sequences.size(), cfg.seed), sequences, first_steps, steps, device);
}

torch::Tensor sampling_uniforms(const std::vector<uint64_t>& seeds, const std::vector<int64_t>& sequences,
                                const std::vector<int64_t>& first_steps, int64_t steps, torch::Device device) {
  const auto rows = static_cast<int64_t>(sequences.size());
  auto host = torch::empty({steps, rows}, torch::TensorOptions().dtype(torch::kFloat64));
  double* u = host.data_ptr<double>();
  for (int64_t k = 0; k < steps; ++k)
    for (int64_t r = 0; r < rows; ++r)
      u[k * rows + r] = sampling_uniform(seeds[static_cast<size_t>(r)], sequences[static_cast<size_t>(r)],
                                         first_steps[static_cast<size_t>(r)] + k);
  return upload(host, device);
}

TokenDraw draw_tokens(const torch::Tensor& logits, const GenerationConfig& cfg, const torch::Tensor& uniforms) {
  if (cfg.greedy) {
    auto tokens = logits.argmax(-1);
    auto log_probs = torch::log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
    return {tokens, log_probs, torch::Tensor()};
  }
  const int64_t vocab = logits.size(1);
  auto scaled = logits / cfg.temperature;
  auto log_probs = torch::log_softmax(scaled, -1);
  auto filtered = scaled;
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (cfg.top_k > 0 && cfg.top_k < vocab) {
    auto kth = std::get<0>(filtered.topk(cfg.top_k, -1)).slice(-1, cfg.top_k - 1);
    filtered = filtered.masked_fill(filtered < kth, neg_inf);
  }
  if (cfg.top_p < 1.0) {
    auto [sorted, order] = filtered.sort(-1, /*descending=*/true);
    auto probs = torch::softmax(sorted, -1);
    // Drop a token when the tokens ranked above it already hold top_p of the mass; the first always stays.
    auto drop = (probs.cumsum(-1) - probs) > cfg.top_p;
    filtered = filtered.scatter(-1, order, sorted.masked_fill(drop, neg_inf));
  }
  // Inverse transform, accumulated in double: a row's token is the first whose cumulative probability exceeds
  // its uniform x the row's total, i.e. the count of cumulative sums at or below it (they never decrease: a
  // binary search). On the CPU the sum runs left to right, as the host loop this replaced did, so the same
  // ids come out.
  auto cumulative = torch::softmax(filtered, -1).to(torch::kFloat32).to(torch::kFloat64).cumsum(-1);
  auto total = cumulative.narrow(-1, vocab - 1, 1).contiguous();
  auto below = torch::searchsorted(cumulative, uniforms.to(cumulative.device()).unsqueeze(-1) * total,
                                   /*out_int32=*/false, /*right=*/true);
  // Rounding may leave the target at the total: then the last token that can be drawn, the first position
  // where the sum reaches its total.
  auto last_possible = torch::searchsorted(cumulative, total, /*out_int32=*/false, /*right=*/false);
  auto tokens = torch::minimum(below, last_possible).squeeze(-1).clamp_max(vocab - 1);  // NaN rows: in range
  total = total.squeeze(-1);
  // No mass: a total that is not a positive finite number (NaN fails both comparisons): three kernels, where
  // isfinite() alone launches four.
  auto no_mass = total.gt(0).logical_and(total.lt(std::numeric_limits<double>::infinity())).logical_not();
  return {tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1), no_mass};
}

void check_sampleable(const torch::Tensor& no_mass) {
  if (!no_mass.defined()) return;
  const auto rows = no_mass.to(torch::kCPU).nonzero();
  HF_CHECK(rows.numel() == 0, "generation: row ", rows.numel() > 0 ? rows[0][0].item<int64_t>() : 0,
           " has no finite sampling distribution (NaN or infinite logits)");
}

TokenDraw choose_tokens_on_device(CausalLM& model, const torch::Tensor& hidden, const GenerationConfig& cfg,
                                  const torch::Tensor& uniforms) {
  auto logits = model->full_vocab_logits(hidden);
  // Batch-invariant mode: the recorded log-probs come from the kernel the actor's recomputation uses, over
  // the whole vocabulary as there (ids past sampleable_vocab_size are still never drawn).
  const torch::Tensor unmasked = batch_invariant_active() ? logits.clone() : torch::Tensor();
  if (cfg.sampleable_vocab_size > 0 && cfg.sampleable_vocab_size < logits.size(-1))
    logits.slice(-1, cfg.sampleable_vocab_size).fill_(-std::numeric_limits<float>::infinity());
  TokenDraw draw = draw_tokens(logits, cfg, uniforms);
  if (unmasked.defined())
    draw.log_probs = batch_invariant::token_log_probs(unmasked, draw.tokens, cfg.greedy ? 1.0 : cfg.temperature,
                                                      /*with_entropy=*/false)
                         .log_probs.to(draw.log_probs.device());
  return draw;
}

std::pair<torch::Tensor, torch::Tensor> choose_tokens(CausalLM& model, const torch::Tensor& hidden,
                                                      const GenerationConfig& cfg,
                                                      const std::vector<int64_t>& sequences,
                                                      const std::vector<int64_t>& steps) {
  const torch::Tensor uniforms =
      cfg.greedy ? torch::Tensor() : sampling_uniforms(cfg, sequences, steps, 1, hidden.device()).squeeze(0);
  TokenDraw draw = choose_tokens_on_device(model, hidden, cfg, uniforms);
  check_sampleable(draw.no_mass);
  return {draw.tokens, draw.log_probs};
}

TokenRing::TokenRing(int64_t rows, int64_t steps, const GenerationConfig& cfg, torch::Device device)
    : steps_(steps), device_(device), eos_token_ids_(cfg.eos_token_ids) {
  packed_ = torch::zeros({3 * steps + 2, rows}, torch::TensorOptions().dtype(torch::kFloat64).device(device));
}

torch::Tensor TokenRing::record(int64_t k, const torch::Tensor& tokens, const torch::Tensor& log_probs,
                                const torch::Tensor& no_mass, const torch::Tensor& drawing) {
  HF_CHECK(mode_ != Mode::kStored, "generation: a token ring takes record() or store(), not both");
  if (mode_ == Mode::kNone) {
    mode_ = Mode::kRecorded;
    ended_ = torch::zeros({packed_.size(1)}, torch::TensorOptions().dtype(torch::kBool).device(device_));
    no_mass_ = torch::zeros_like(ended_);
    if (!eos_token_ids_.empty()) eos_ids_ = upload(torch::tensor(eos_token_ids_, torch::kInt64), device_);
  }
  torch::Tensor live = ended_.logical_not();
  if (drawing.defined()) live = live.logical_and(drawing);
  // float64 holds every token id (< 2^53) and every float32 log-prob exactly.
  packed_[k].copy_(tokens);
  packed_[steps_ + k].copy_(log_probs);
  packed_[2 * steps_ + k].copy_(live);
  if (no_mass.defined()) no_mass_.logical_or_(no_mass.logical_and(live));
  if (eos_ids_.defined()) ended_.logical_or_(torch::isin(tokens, eos_ids_).logical_and(live));
  return live;
}

void TokenRing::store(int64_t k, const torch::Tensor& tokens, const torch::Tensor& log_probs,
                      const torch::Tensor& no_mass) {
  HF_CHECK(mode_ != Mode::kRecorded, "generation: a token ring takes record() or store(), not both");
  mode_ = Mode::kStored;
  packed_[k].copy_(tokens);
  packed_[steps_ + k].copy_(log_probs);
  if (no_mass.defined()) packed_[2 * steps_ + k].copy_(no_mass);
}

TokenRing::Chunk TokenRing::read_back() {
  if (mode_ == Mode::kStored) return read_back_stored(packed_.to(torch::kCPU));
  if (mode_ == Mode::kRecorded) {
    packed_[3 * steps_].copy_(ended_);
    packed_[3 * steps_ + 1].copy_(no_mass_);
  }
  const torch::Tensor host = packed_.to(torch::kCPU);
  check_sampleable(host[3 * steps_ + 1].gt(0.5));
  return {host.narrow(0, 0, steps_).to(torch::kInt64), host.narrow(0, steps_, steps_).to(torch::kFloat32),
          host.narrow(0, 2 * steps_, steps_).gt(0.5), host[3 * steps_].gt(0.5)};
}

// What record() computes on the device, step by step, from the stored draws: a row's token counts while no
// earlier counted token of the chunk was an eos id; its no-mass flags count where its token does.
TokenRing::Chunk TokenRing::read_back_stored(const torch::Tensor& host) const {
  const int64_t rows = host.size(1);
  Chunk chunk{host.narrow(0, 0, steps_).to(torch::kInt64), host.narrow(0, steps_, steps_).to(torch::kFloat32),
              torch::empty({steps_, rows}, torch::TensorOptions().dtype(torch::kBool)),
              torch::empty({rows}, torch::TensorOptions().dtype(torch::kBool))};
  const auto tokens = chunk.tokens.accessor<int64_t, 2>();
  const auto no_mass = host.accessor<double, 2>();
  auto live = chunk.live.accessor<bool, 2>();
  auto ended = chunk.ended.accessor<bool, 1>();
  int64_t first_without_mass = -1;
  for (int64_t r = 0; r < rows; ++r) {
    bool done = false;
    for (int64_t k = 0; k < steps_; ++k) {
      live[k][r] = !done;
      if (done) continue;
      if (no_mass[2 * steps_ + k][r] > 0.5 && first_without_mass < 0) first_without_mass = r;
      done = std::find(eos_token_ids_.begin(), eos_token_ids_.end(), tokens[k][r]) != eos_token_ids_.end();
    }
    ended[r] = done;
  }
  HF_CHECK(first_without_mass < 0, "generation: row ", first_without_mass,
           " has no finite sampling distribution (NaN or infinite logits)");
  return chunk;
}

bool is_eos(const GenerationConfig& cfg, int64_t token) {
  return std::find(cfg.eos_token_ids.begin(), cfg.eos_token_ids.end(), token) != cfg.eos_token_ids.end();
}

}  // namespace generation

GenerationOutput generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& cfg, Communicator* stages) {
  // The prefill's norms in the operators' rounding, which the fused decode kernels reproduce (model/rms_norm.h).
  const OperatorRmsNormScope operator_norms;
  const ModelConfig& mc = model->config();
  check_config(cfg, mc.vocab_size);
  HF_CHECK(model->head_kind() == HeadKind::kLanguageModel,
           "generation: the model has a value head, not a language-model head");
  const PipelineStage& stage = model->pipeline_stage();
  HF_CHECK(!stage.enabled() || (stages != nullptr && stages->size() == stage.stages && stages->rank() == stage.stage),
           "generation: the model is pipeline stage ", stage.stage, " of ", stage.stages,
           " and needs the communicator over its stages (one rank per stage, in stage order) to generate with them");
  HF_CHECK(!prompts.empty() || cfg.next_prompts, "generation: no prompts given");
  for (size_t i = 0; i < prompts.size(); ++i) {
    HF_CHECK(!prompts[i].empty(), "generation: prompt ", i, " is empty; every prompt needs at least one token");
    for (int64_t token : prompts[i])
      HF_CHECK(token >= 0 && token < mc.vocab_size, "generation: prompt ", i, " has token id ", token,
               " outside the vocabulary [0, ", mc.vocab_size, ")");
  }
  torch::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);
  HF_CHECK(!cfg.refresh_weights || (cfg.use_kv_cache && cfg.continuous_batching && stages == nullptr && !cfg.record_routing),
           "generation: new weights mid-generation (partial rollouts) need continuous batching on a KV cache, "
           "one pipeline stage and no routing record (a prefix prefilled again would be routed twice)");
  HF_CHECK((!cfg.next_prompts && !cfg.on_group_finished) ||
               (cfg.use_kv_cache && cfg.continuous_batching && stages == nullptr && !cfg.record_routing),
           "generation: streaming prompts in and groups out needs continuous batching on a KV cache, one pipeline "
           "stage and no routing record");
  HF_CHECK(!cfg.next_prompts || !model->experts_need_lockstep(),
           "generation: streaming prompts in needs gathered experts (actor_rollout_ref.rollout.expert_parallel_size 1)");
  HF_CHECK((!cfg.stop_requested && !cfg.resume) ||
               (cfg.use_kv_cache && cfg.continuous_batching && stages == nullptr && !cfg.record_routing),
           "generation: stopping and continuing a generation need continuous batching on a KV cache, one pipeline "
           "stage and no routing record");
  check_required_decode_graphs(model, cfg);
  // Expert parallelism with the experts left split (rollout expert_parallel_size = the actor's): every rank of
  // the group exchanges tokens with the others in each MoE layer, so all of them take the same forwards; the
  // static batch keeps them in step (continuous batching's admissions differ from rank to rank).
  if (model->experts_need_lockstep()) {
    HF_CHECK(stages == nullptr && !cfg.record_routing && !cfg.refresh_weights && !cfg.stop_requested && !cfg.resume,
             "generation: expert-parallel decoding (actor_rollout_ref.rollout.expert_parallel_size > 1) runs ",
             "unstaged, without recording the routing (router_replay.mode R3) and without partial rollouts; set ",
             "actor_rollout_ref.rollout.expert_parallel_size = 1 to generate on gathered experts");
    return generation::generate_static(model, prompts, cfg, stages);
  }
  if (cfg.record_routing) {
    HF_CHECK(mc.num_moe_layers() > 0, "generation: recording the routing (router_replay.mode R3) needs a ",
             "mixture-of-experts model; ", mc.model_type, " has no MoE layer");
    HF_CHECK(cfg.use_kv_cache && cfg.continuous_batching, "generation: the routing is recorded on the continuous ",
             "batching path (use_kv_cache and continuous_batching)");
    HF_CHECK(!stage.enabled(), "generation: recording the routing needs the whole model in one stage (rollout ",
             "pipeline_model_parallel_size = 1), this model is stage ", stage.stage, " of ", stage.stages);
    RoutingRecordGuard recording(model);
    return generation::generate_continuous(model, prompts, cfg, stages);
  }
  if (cfg.use_kv_cache && cfg.continuous_batching) return generation::generate_continuous(model, prompts, cfg, stages);
  return generation::generate_static(model, prompts, cfg, stages);
}

}  // namespace hybridflow
