#include "hybridflow/engine/generation.h"

#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "hybridflow/core/error.h"

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

}  // namespace

std::pair<torch::Tensor, torch::Tensor> sample_next_tokens(const torch::Tensor& logits, const GenerationConfig& cfg,
                                                           at::Generator& generator) {
  if (cfg.greedy) {
    auto tokens = logits.argmax(-1);
    auto log_probs = torch::log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1);
    return {tokens, log_probs};
  }
  auto scaled = logits / cfg.temperature;
  auto log_probs = torch::log_softmax(scaled, -1);
  auto filtered = scaled.clone();
  const double neg_inf = -std::numeric_limits<double>::infinity();
  if (cfg.top_k > 0 && cfg.top_k < filtered.size(-1)) {
    auto kth = std::get<0>(filtered.topk(cfg.top_k, -1)).slice(-1, cfg.top_k - 1);
    filtered.masked_fill_(filtered < kth, neg_inf);
  }
  if (cfg.top_p < 1.0) {
    auto [sorted, order] = filtered.sort(-1, /*descending=*/true);
    auto probs = torch::softmax(sorted, -1);
    // Drop a token when the tokens ranked above it already hold top_p of the mass; the first always stays.
    auto drop = (probs.cumsum(-1) - probs) > cfg.top_p;
    filtered.scatter_(-1, order, sorted.masked_fill(drop, neg_inf));
  }
  // Draw on the CPU so the seeded CPU generator serves models on any device.
  auto probs = torch::softmax(filtered, -1).to(torch::kCPU);
  auto tokens = torch::multinomial(probs, 1, /*replacement=*/false, generator).squeeze(-1).to(logits.device());
  return {tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)};
}

GenerationOutput generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& cfg, Communicator* stages) {
  const ModelConfig& mc = model->config();
  check_config(cfg, mc.vocab_size);
  HF_CHECK(model->head_kind() == HeadKind::kLanguageModel, "generation: the model has a value head, not a language-model head");
  const PipelineStage& stage = model->pipeline_stage();
  HF_CHECK(!stage.enabled() || (stages != nullptr && stages->size() == stage.stages && stages->rank() == stage.stage),
           "generation: the model is pipeline stage ", stage.stage, " of ", stage.stages,
           " and needs the communicator over its stages (one rank per stage, in stage order) to generate with them");
  HF_CHECK(!prompts.empty(), "generation: no prompts given");
  torch::NoGradGuard no_grad;
  EvalModeGuard eval_mode(model);

  const torch::Device device = model->parameters().front().device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t batch = static_cast<int64_t>(prompts.size()) * cfg.n;
  int64_t prompt_len = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    HF_CHECK(!prompts[i].empty(), "generation: prompt ", i, " is empty; every prompt needs at least one token");
    for (int64_t token : prompts[i])
      HF_CHECK(token >= 0 && token < mc.vocab_size, "generation: prompt ", i, " has token id ", token,
               " outside the vocabulary [0, ", mc.vocab_size, ")");
    prompt_len = std::max<int64_t>(prompt_len, prompts[i].size());
  }

  auto prompt_ids = torch::full({batch, prompt_len}, cfg.pad_token_id, i64);
  auto prompt_mask = torch::zeros({batch, prompt_len}, i64);
  {
    auto ids = prompt_ids.accessor<int64_t, 2>();
    auto mask = prompt_mask.accessor<int64_t, 2>();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const int64_t offset = prompt_len - static_cast<int64_t>(prompts[i].size());
      for (int64_t j = 0; j < cfg.n; ++j)
        for (size_t t = 0; t < prompts[i].size(); ++t) {
          ids[i * cfg.n + j][offset + t] = prompts[i][t];
          mask[i * cfg.n + j][offset + t] = 1;
        }
    }
  }
  prompt_ids = prompt_ids.to(device);
  prompt_mask = prompt_mask.to(device);

  auto responses = torch::full({batch, cfg.max_new_tokens}, cfg.pad_token_id, i64.device(device));
  auto response_mask = torch::zeros({batch, cfg.max_new_tokens}, i64.device(device));
  auto log_probs = torch::zeros({batch, cfg.max_new_tokens}, torch::TensorOptions().dtype(torch::kFloat32).device(device));

  auto generator = at::make_generator<at::CPUGeneratorImpl>(cfg.seed);
  // Only unfinished rows stay in the batch: `active` maps them to output rows, and the cache, ids and
  // mask shrink with them.
  auto active = torch::arange(batch, i64.device(device));
  auto seq_ids = prompt_ids;
  auto seq_mask = prompt_mask;
  KVCache cache;
  cache.capacity = prompt_len + cfg.max_new_tokens;  // one slab per layer, written in place
  // With the cache, the mask of every step is a prefix of one built here (the prompt's, then ones), and a
  // new token's position is the previous one's plus one: nothing is rebuilt from the growing mask.
  torch::Tensor full_mask, next_position;
  if (cfg.use_kv_cache) {
    full_mask = torch::cat({prompt_mask, torch::ones({batch, cfg.max_new_tokens}, prompt_mask.options())}, 1);
    next_position = prompt_mask.sum(1, /*keepdim=*/true);  // [B, 1]: the count of real prompt tokens
  }
  // The n samples of a prompt share its prefill: the prompt runs once (rows i*n of the batch) and its cache
  // and last hidden state are copied to its n rows before the first token is drawn.
  const bool shared_prefill = cfg.use_kv_cache && cfg.n > 1;
  const auto first_rows = torch::arange(0, batch, cfg.n, i64.device(device));
  torch::Tensor step_input = shared_prefill ? prompt_ids.index_select(0, first_rows) : prompt_ids;
  int64_t longest = 0;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    const bool prefill_shared_now = shared_prefill && step == 0;
    const int64_t rows_now = prefill_shared_now ? step_input.size(0) : seq_mask.size(0);
    // A later stage starts from the hidden states of the stage before; every stage keeps the cache of its
    // own layers.
    if (stage.enabled() && !stage.first()) {
      torch::Tensor input =
          model->stage_activation_like(rows_now, cfg.use_kv_cache ? step_input.size(1) : seq_ids.size(1));
      stages->recv(input, stage.stage - 1);
      model->set_stage_input(input);
    }
    torch::Tensor hidden;
    if (cfg.use_kv_cache) {
      const int64_t total = prompt_len + step;
      if (step == 0) {
        auto mask = prefill_shared_now ? prompt_mask.index_select(0, first_rows) : prompt_mask;
        hidden = model->hidden_states(step_input, mask, position_ids_from_mask(mask), &cache);
      } else {
        hidden = model->hidden_states(step_input, full_mask.narrow(1, 0, total), next_position, &cache);
        next_position = next_position + 1;
      }
    } else {
      hidden = model->hidden_states(seq_ids, seq_mask);
    }
    if (stage.enabled() && !stage.last()) stages->send(hidden.contiguous(), stage.stage + 1);
    if (prefill_shared_now) {
      // Row i of the prefill is prompt i (batch row i*n): repeat it for the prompt's n samples.
      const auto per_prompt = torch::arange(static_cast<int64_t>(prompts.size()), i64.device(device))
                                  .repeat_interleave(cfg.n);
      cache.select_rows(per_prompt);
      if (!stage.enabled() || stage.last()) hidden = hidden.select(1, -1).index_select(0, per_prompt).unsqueeze(1);
    }
    torch::Tensor tokens, token_log_probs;
    if (!stage.enabled() || stage.last()) {
      // Only the last position's logits are needed; the prompt's [B, P, vocab] would dominate memory.
      auto logits = model->full_vocab_logits(hidden.select(1, -1));
      if (cfg.sampleable_vocab_size > 0 && cfg.sampleable_vocab_size < logits.size(-1))
        logits.slice(-1, cfg.sampleable_vocab_size).fill_(-std::numeric_limits<float>::infinity());
      std::tie(tokens, token_log_probs) = sample_next_tokens(logits, cfg, generator);
    }
    if (stage.enabled()) {
      // The last stage's choice reaches every stage: each needs the tokens for its next input and its rows.
      const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
      torch::Tensor chosen = stage.last() ? torch::stack({tokens.to(torch::kFloat64), token_log_probs.to(torch::kFloat64)})
                                          : torch::empty({2, seq_mask.size(0)}, f64);
      stages->broadcast(chosen, stage.stages - 1);
      tokens = chosen[0].to(torch::kInt64);
      token_log_probs = chosen[1].to(torch::kFloat32);
    }
    responses.index_put_({active, step}, tokens);
    response_mask.index_put_({active, step}, 1);
    log_probs.index_put_({active, step}, token_log_probs);
    longest = step + 1;

    if (!cfg.use_kv_cache) {
      auto ones = torch::ones({seq_mask.size(0), 1}, seq_mask.options());
      seq_ids = torch::cat({seq_ids, tokens.unsqueeze(1)}, 1);
      seq_mask = torch::cat({seq_mask, ones}, 1);
    }
    step_input = tokens.unsqueeze(1);
    if (!cfg.eos_token_ids.empty()) {
      auto keep = torch::ones_like(tokens, torch::kBool);
      for (int64_t eos : cfg.eos_token_ids) keep &= tokens.ne(eos);
      if (!keep.all().item<bool>()) {
        auto rows = keep.nonzero().squeeze(1);
        if (rows.numel() == 0) break;
        active = active.index_select(0, rows);
        if (cfg.use_kv_cache) {
          full_mask = full_mask.index_select(0, rows);
          next_position = next_position.index_select(0, rows);
          cache.select_rows(rows);
        } else {
          seq_ids = seq_ids.index_select(0, rows);
        }
        seq_mask = seq_mask.index_select(0, rows);
        step_input = step_input.index_select(0, rows);
      }
    }
  }

  GenerationOutput out;
  out.prompts = prompt_ids;
  out.prompt_mask = prompt_mask;
  out.responses = responses.slice(1, 0, longest).contiguous();
  out.response_mask = response_mask.slice(1, 0, longest).contiguous();
  out.log_probs = log_probs.slice(1, 0, longest).contiguous();
  return out;
}

}  // namespace hybridflow
