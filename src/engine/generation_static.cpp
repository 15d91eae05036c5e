// The static batch: every sequence of the call in one left-padded batch, the KV cache a slab per layer
// ([rows, kv_heads, prompt + new tokens, head_dim]) written in place, each prompt prefilled once for its n
// samples, and rows that reach eos dropped from the batch (their cache rows with them). Without the cache
// it recomputes the whole sequence every step. This was the generator before continuous batching; it
// stays as the benchmark's in-run baseline and the recomputation path the tests check against.
//
// Expert-parallel decoding (the model's experts split over its group, not gathered): each MoE layer exchanges
// tokens with the group, so every rank runs the same forwards. Finished rows then stay in the batch (their
// tokens are not written), and the ranks stop together when no row of any of them is unfinished; the stop
// needs the group's count every step, so such a decode reads back every step whatever readback_interval says.
#include <algorithm>
#include <optional>

#include "engine/generation_steps.h"

namespace hybridflow::generation {

GenerationOutput generate_static(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                 const GenerationConfig& cfg, Communicator* stages) {
  const torch::Device device = model->parameters().front().device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const int64_t batch = static_cast<int64_t>(prompts.size()) * cfg.n;
  const PromptBatch padded = pad_prompts(prompts, cfg, device);
  const torch::Tensor& prompt_ids = padded.ids;
  const torch::Tensor& prompt_mask = padded.mask;
  const int64_t prompt_len = padded.longest;
  StageLink link(model, stages);
  const ExpertParallelGroup& ep = model->expert_parallel();
  const bool lockstep = model->experts_need_lockstep();

  auto responses = torch::full({batch, cfg.max_new_tokens}, cfg.pad_token_id, i64.device(device));
  auto response_mask = torch::zeros({batch, cfg.max_new_tokens}, i64.device(device));
  auto log_probs =
      torch::zeros({batch, cfg.max_new_tokens}, torch::TensorOptions().dtype(torch::kFloat32).device(device));

  // Only unfinished rows stay in the batch: `active` maps them to output rows (also kept on the CPU for the
  // sampling draws), and the cache, ids and mask shrink with them.
  auto active = torch::arange(batch, i64.device(device));
  std::vector<int64_t> active_rows(static_cast<size_t>(batch));
  for (int64_t r = 0; r < batch; ++r) active_rows[static_cast<size_t>(r)] = r;
  auto seq_ids = prompt_ids;
  auto seq_mask = prompt_mask;
  KVCache cache;
  cache.capacity = prompt_len + cfg.max_new_tokens;  // one slab per layer, written in place
  cache.expert_parallel_lockstep = lockstep;
  auto unfinished = torch::ones({batch}, torch::TensorOptions().dtype(torch::kBool).device(device));  // lockstep
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
  // Stop checks stay on the device for a chunk of readback_interval steps: a row that draws an eos id keeps
  // its place (its later tokens are written as padding) until the chunk is read back, when rows that ended
  // leave the batch.
  int64_t longest = 0, host_syncs = 0, decode_steps = 0;
  std::optional<TokenRing> ring;
  int64_t chunk_start = 0, chunk_steps = 0;
  for (int64_t step = 0; step < cfg.max_new_tokens; ++step) {
    if (!ring) {
      chunk_start = step;
      chunk_steps = lockstep ? 1 : std::min(cfg.readback_interval, cfg.max_new_tokens - step);
      ring.emplace(static_cast<int64_t>(active_rows.size()), chunk_steps, cfg, device);
    }
    const bool prefill_shared_now = shared_prefill && step == 0;
    const int64_t rows_now = prefill_shared_now ? step_input.size(0) : seq_mask.size(0);
    // A later stage starts from the hidden states of the stage before; every stage keeps the cache of its
    // own layers.
    link.receive(rows_now, cfg.use_kv_cache ? step_input.size(1) : seq_ids.size(1));
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
    link.send(hidden);
    if (prefill_shared_now) {
      // Row i of the prefill is prompt i (batch row i*n): repeat it for the prompt's n samples.
      const auto per_prompt =
          torch::arange(static_cast<int64_t>(prompts.size()), i64.device(device)).repeat_interleave(cfg.n);
      cache.select_rows(per_prompt);
      if (link.samples()) hidden = hidden.select(1, -1).index_select(0, per_prompt).unsqueeze(1);
    }
    TokenDraw draw;
    if (link.samples()) {
      // Only the last position's logits are needed; the prompt's [B, P, vocab] would dominate memory.
      const torch::Tensor uniforms =
          cfg.greedy ? torch::Tensor()
                     : sampling_uniforms(cfg, active_rows, std::vector<int64_t>(active_rows.size(), step), 1, device)
                           .squeeze(0);
      draw = choose_tokens_on_device(model, hidden.select(1, -1), cfg, uniforms);
    }
    link.share(draw.tokens, draw.log_probs, static_cast<int64_t>(active_rows.size()));
    const torch::Tensor& tokens = draw.tokens;
    // Under lockstep, rows finished before this step ran only to keep the group in step: their tokens are dropped.
    torch::Tensor live = ring->record(step - chunk_start, tokens, draw.log_probs, draw.no_mass);
    if (lockstep) live = live.logical_and(unfinished);
    responses.index_put_({active, step}, tokens.masked_fill(live.logical_not(), cfg.pad_token_id));
    response_mask.index_put_({active, step}, live.to(torch::kInt64));
    log_probs.index_put_({active, step}, draw.log_probs.masked_fill(live.logical_not(), 0));
    ++decode_steps;

    if (!cfg.use_kv_cache) {
      auto ones = torch::ones({seq_mask.size(0), 1}, seq_mask.options());
      seq_ids = torch::cat({seq_ids, tokens.unsqueeze(1)}, 1);
      seq_mask = torch::cat({seq_mask, ones}, 1);
    }
    step_input = tokens.unsqueeze(1);
    if (step - chunk_start + 1 < chunk_steps) continue;
    // The chunk's one read of the device: which rows ended, and how far each row's response reaches.
    const TokenRing::Chunk chunk = ring->read_back();
    ring.reset();
    ++host_syncs;
    if (lockstep) {
      if (unfinished.any().item<bool>()) longest = step + 1;
      unfinished &= upload(chunk.ended, device).logical_not();
      auto left = unfinished.sum().to(torch::kCPU, torch::kInt64).reshape({1});
      ep.comm()->all_reduce(left);  // every rank of the group stops at the same step
      if (left.item<int64_t>() == 0) break;
      continue;
    }
    const auto drawn = chunk.live.sum(0);
    longest = std::max(longest, chunk_start + drawn.max().item<int64_t>());
    if (!chunk.ended.any().item<bool>()) continue;
    std::vector<int64_t> kept, still_active;
    const auto ended = chunk.ended.accessor<bool, 1>();
    for (int64_t i = 0; i < ended.size(0); ++i)
      if (!ended[i]) {
        kept.push_back(i);
        still_active.push_back(active_rows[static_cast<size_t>(i)]);
      }
    if (kept.empty()) break;
    const auto rows = upload(torch::tensor(kept, torch::kInt64), device);
    active_rows = std::move(still_active);
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

  GenerationOutput out;
  out.prompts = prompt_ids;
  out.prompt_mask = prompt_mask;
  out.responses = responses.slice(1, 0, longest).contiguous();
  out.response_mask = response_mask.slice(1, 0, longest).contiguous();
  out.log_probs = log_probs.slice(1, 0, longest).contiguous();
  out.host_syncs = host_syncs;
  out.decode_steps = decode_steps;
  return out;
}

}  // namespace hybridflow::generation
