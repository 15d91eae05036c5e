// Continuous batching: a fixed number of KV-cache slots, each holding one sequence from position 0 (no
// padding). Whenever a prompt's n samples fit in the free slots (while others decode: when the prompts that fit
// bring at least admission_rows samples, GenerationConfig::admission_rows), waiting prompts are prefilled
// together, once each, and their keys and values copied to their samples' slots; every step then decodes one token
// for each running sequence at its own position (CausalLM::decode_slots), and a sequence that ends frees
// its slot at once. Nothing is gathered or compacted when sequences end: rows just stop naming their slot.
//
// With the paged KV cache (cfg.paged_kv_cache) the slots are only the rows' places in the batch (the same
// row order as the slab cache's, so the same arithmetic); keys and values live in blocks of a shared pool
// (BlockManager): a prompt is prefilled and stored once for its n samples, which copy its partly filled last
// block when they first write, blocks are taken as tokens arrive and freed when a sequence ends, and a
// prompt is admitted when, besides free slots, the blocks its samples can ever hold are free and unreserved.
//
// Every pipeline stage runs this same schedule: the last stage's tokens reach all stages (StageLink), and
// the schedule depends on nothing else (the block pool is sized from the whole model, the same on every
// stage).
#include <sys/mman.h>

#include <algorithm>
#include <optional>
#include <set>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/block_manager.h"
#include "hybridflow/engine/decode_graph_cache.h"
#include "hybridflow/engine/decode_graphs.h"
#include "hybridflow/engine/prefix_cache.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/tensor_parallel_layout.h"

namespace hybridflow::generation {

// A slab of zeros. On the CPU from fresh anonymous pages, which the kernel zeroes when first touched: most
// slots never fill their capacity (answers stop early), and writing zeros to all of it cost as much as a
// tenth of a short rollout.
torch::Tensor zero_slab(const std::vector<int64_t>& sizes, const torch::TensorOptions& options) {
  if (!options.device().is_cpu()) return torch::zeros(sizes, options);
  int64_t count = 1;
  for (int64_t size : sizes) count *= size;
  const size_t bytes = static_cast<size_t>(count) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  void* memory = mmap(nullptr, std::max<size_t>(bytes, 1), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  HF_CHECK(memory != MAP_FAILED, "generation: cannot map ", bytes,
           " bytes for the KV cache (max_num_seqs sets a slab's rows, kv_cache_blocks a pool's blocks)");
  return torch::from_blob(
      memory, sizes, [bytes](void* p) { munmap(p, std::max<size_t>(bytes, 1)); }, options);
}

int64_t given_pool_blocks(CausalLM& model, const GenerationConfig& cfg) {
  if (cfg.kv_cache_blocks > 0) return cfg.kv_cache_blocks;
  if (cfg.memory_budget_bytes <= 0) return 0;
  const ModelConfig& c = model->config();
  const int tp = model->tensor_parallel().size();
  const int64_t kv_heads = kv_heads_replicated(c, tp) ? 1 : c.num_key_value_heads / tp;
  const auto element = static_cast<double>(model->parameters().front().element_size());
  const double block_bytes =
      2.0 * static_cast<double>(c.num_hidden_layers * kv_heads * cfg.kv_block_size * c.head_dim()) * element;
  const double weight_bytes = model_size(c).parameters() / tp * element;
  return kv_blocks_in_budget(static_cast<double>(cfg.memory_budget_bytes), cfg.gpu_memory_utilization, weight_bytes,
                             block_bytes);
}

namespace {

// A running sequence.
struct Row {
  int64_t sequence = 0;  // output row: prompt i's sample j is i * n + j
  int64_t slot = 0;
  int64_t length = 0;  // positions in its slot's cache
  int64_t token = 0;   // the last token drawn: the next step's input
  int64_t paged = -1;  // its sequence in the block manager (paged cache)
};

// The paged pool's size in blocks for cfg (see GenerationConfig): given, from the memory budget, or by default
// what the running sequences can hold at their longest, so that nothing waits for blocks: every prompt's
// samples at once, or, when fewer sequences run at once (slots), that many each with a whole table and a
// copied block (a prompt's shared blocks are held by at most its running samples) - the slabs' size, about.
// A streamed run (streamed_longest > 0: its prompts' most tokens) is sized for its slots at that length.
int64_t paged_pool_blocks(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                          const GenerationConfig& cfg, int64_t slots, const BlockManager& sizing,
                          int64_t streamed_longest) {
  const int64_t given = given_pool_blocks(model, cfg);
  if (given > 0) return given;
  int64_t every_prompt = 0, longest_sequence = 0;
  for (const auto& p : prompts) {
    const auto length = static_cast<int64_t>(p.size());
    const int64_t most = length + std::max<int64_t>(cfg.max_new_tokens - 1, 0);
    every_prompt += sizing.worst_case_blocks(length, cfg.n, most);
    longest_sequence = std::max(longest_sequence, sizing.blocks_for(most) + 1);
  }
  if (streamed_longest > 0) {
    longest_sequence = std::max(
        longest_sequence, sizing.blocks_for(streamed_longest + std::max<int64_t>(cfg.max_new_tokens - 1, 0)) + 1);
    return std::max<int64_t>(slots * longest_sequence, 1);
  }
  return std::max<int64_t>(std::min(every_prompt, slots * longest_sequence), 1);
}

class Scheduler {
 public:
  Scheduler(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& cfg,
            Communicator* stages)
      : model_(model),
        prompts_(prompts),
        cfg_(cfg),
        link_(model, stages),
        device_(model->parameters().front().device()),
        total_(static_cast<int64_t>(prompts.size()) * cfg.n),
        tokens_(static_cast<size_t>(total_)),
        log_probs_(static_cast<size_t>(total_)),
        versions_(static_cast<size_t>(total_)),
        prompt_routing_(cfg.record_routing ? static_cast<size_t>(total_) : 0),
        response_routing_(cfg.record_routing ? static_cast<size_t>(total_) : 0) {
    int64_t longest_prompt = 0;
    for (const auto& p : prompts) longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(p.size()));
    if (cfg.next_prompts) {
      HF_CHECK(cfg.max_prompt_length > 0 || longest_prompt > 0, "generation: streaming prompts in needs "
               "max_prompt_length (the longest streamed prompt, which sizes the KV cache)");
      streamed_longest_ = cfg.max_prompt_length > 0 ? cfg.max_prompt_length : longest_prompt;
      longest_prompt = std::max(longest_prompt, streamed_longest_);
    }
    capacity_ = longest_prompt + cfg.max_new_tokens;
    // A streamed run has no total to cap the slots at (max_num_seqs 0: the call's own prompts' samples).
    const int64_t wanted = std::max(cfg.n, cfg.max_num_seqs > 0 ? cfg.max_num_seqs : total_);
    const int64_t slots = cfg.next_prompts ? wanted : std::min(total_, wanted);
    slot_count_ = slots;
    admission_rows_ = cfg.admission_rows < 0 ? slots / 4 : cfg.admission_rows;
    for (int64_t s = 0; s < slots; ++s) free_slots_.insert(s);
    if (cfg.paged_kv_cache) {
      const BlockManager sizing(1, cfg.kv_block_size);
      int64_t pool_blocks = paged_pool_blocks(model, prompts, cfg, slots, sizing, streamed_longest_);
      if (cfg.decode_graph_cache) {
        // An earlier call's pools and graphs, if they hold this call (else dropped before ours are made): the
        // pool keeps its size, at least what this call needs.
        fingerprint_ = decode_graph_fingerprint(model, cfg);
        kept_ = cfg.decode_graph_cache->take(fingerprint_, pool_blocks, capacity_, graph_rows());
        if (kept_) pool_blocks = kept_->pool_blocks;
      }
      blocks_.emplace(pool_blocks, cfg.kv_block_size);
      // Prefix caching needs keys that stay valid: not across a weight refresh, and not where a prompt's routing
      // is recorded position by position (a cached prefix is not run again).
      if (cfg.enable_prefix_caching && !cfg.refresh_weights && !cfg.record_routing)
        prefix_cache_.emplace(cfg.kv_block_size);
    }
    finished_.assign(static_cast<size_t>(total_), false);
    for (size_t i = 0; i < prompts.size(); ++i) {
      prompt_seed_.push_back(cfg.seed);
      prompt_first_sequence_.push_back(static_cast<int64_t>(i) * cfg.n);
    }
    if (cfg.resume) take_saved(*cfg.resume);
    group_left_.assign(prompts.size(), cfg.n);
    for (int64_t q = 0; q < total_; ++q)
      if (finished_[static_cast<size_t>(q)]) --group_left_[static_cast<size_t>(q / cfg.n)];
    group_handed_.assign(prompts.size(), false);
  }

  // With cfg.decode_graph_cache: this call's pools and graphs kept for the next call (after output()).
  void keep_for_next_call() {
    if (!cfg_.decode_graph_cache) return;
    if (kept_) {  // nothing was prefilled: the taken set goes back as it came
      cfg_.decode_graph_cache->keep(std::move(*kept_));
      return;
    }
    if (paged_.keys.empty()) return;
    cfg_.decode_graph_cache->keep({.fingerprint = fingerprint_,
                                   .pools = std::move(paged_),
                                   .graphs = std::move(graphs_),
                                   .pool_blocks = blocks_->num_blocks(),
                                   .max_span = set_max_span_,
                                   .max_rows = set_max_rows_});
  }

  // Every prompt of the run: the call's own, then the streamed ones in admission order.
  const std::vector<std::vector<int64_t>>& prompts() const { return prompts_; }

  void run() {
    while (true) {
      if (cfg_.stop_requested && cfg_.stop_requested()) {
        stopped_ = std::find(finished_.begin(), finished_.end(), false) != finished_.end();
        break;
      }
      refresh_weights();
      stream_in();
      while (admit()) {
      }
      if (rows_.empty()) break;  // with every slot free, admit() stops only when no prompt waits
      decode();
    }
  }

  GenerationOutput output(const PromptBatch& padded) const {
    int64_t longest = 0;
    for (const auto& t : tokens_) longest = std::max<int64_t>(longest, static_cast<int64_t>(t.size()));
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    auto responses = torch::full({total_, longest}, cfg_.pad_token_id, i64);
    auto mask = torch::zeros({total_, longest}, i64);
    auto log_probs = torch::zeros({total_, longest}, torch::TensorOptions().dtype(torch::kFloat32));
    auto r = responses.accessor<int64_t, 2>();
    auto m = mask.accessor<int64_t, 2>();
    auto lp = log_probs.accessor<float, 2>();
    for (int64_t q = 0; q < total_; ++q)
      for (size_t t = 0; t < tokens_[static_cast<size_t>(q)].size(); ++t) {
        r[q][static_cast<int64_t>(t)] = tokens_[static_cast<size_t>(q)][t];
        m[q][static_cast<int64_t>(t)] = 1;
        lp[q][static_cast<int64_t>(t)] = log_probs_[static_cast<size_t>(q)][t];
      }
    GenerationOutput out;
    out.prompts = padded.ids;
    out.prompt_mask = padded.mask;
    out.responses = responses.to(device_);
    out.response_mask = mask.to(device_);
    out.log_probs = log_probs.to(device_);
    if (cfg_.refresh_weights) {
      auto versions = torch::full({total_, longest}, version_, i64);
      auto v = versions.accessor<int64_t, 2>();
      for (int64_t q = 0; q < total_; ++q)
        for (size_t t = 0; t < versions_[static_cast<size_t>(q)].size(); ++t)
          v[q][static_cast<int64_t>(t)] = versions_[static_cast<size_t>(q)][t];
      out.token_versions = versions.to(device_);
      out.resumed_sequences = static_cast<int64_t>(resumed_.size());
    }
    if (cfg_.record_routing) out.routed_experts = routed_experts(padded.longest, longest).to(device_);
    if (graphs_) {
      out.decode_graphs = graphs_->captured();
      out.decode_graphs_taken = graphs_taken_;
      out.graph_steps = graphs_->replayed_steps();
    }
    out.host_syncs = host_syncs_;
    out.decode_steps = decode_steps_;
    out.prefills = prefills_;
    if (cfg_.stop_requested) {
      out.stopped = stopped_;
      out.finished = torch::zeros({total_}, torch::TensorOptions().dtype(torch::kBool));
      for (int64_t q = 0; q < total_; ++q) out.finished[q] = static_cast<bool>(finished_[static_cast<size_t>(q)]);
    }
    KVCacheReport& report = out.kv_cache;
    int64_t longest_prompt = 0;
    for (const auto& p : prompts_) longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(p.size()));
    if (blocks_) {
      report.block_bytes = paged_.block_bytes();
      report.pool_blocks = blocks_->num_blocks();
      report.kept_pools = kept_pools_;
      report.peak_blocks = blocks_->peak_used_blocks();
      report.peak_bytes = report.peak_blocks * report.block_bytes;
      report.prefix_cached_tokens = prefix_cached_tokens_;
      report.sequences_fit = sequences_that_fit(report.pool_blocks, blocks_->block_size(),
                                                std::max<int64_t>(1, longest_prompt + cfg_.max_new_tokens - 1));
    } else {
      for (const auto* slabs : {&cache_.keys, &cache_.values})
        for (const auto& slab : *slabs) report.peak_bytes += slab.numel() * static_cast<int64_t>(slab.element_size());
      report.sequences_fit = slot_count_;
    }
    return out;
  }

 private:
  // Prefills as many waiting prompts as have room for all their samples; false when none has. Paged: as many as
  // one forward of max_num_batched_tokens positions holds (the rest join in the next passes). With prefix
  // caching a prompt starts on the held blocks of another's identical first blocks and prefills only the rest;
  // one that would find more blocks in a prompt admitted beside it waits for the next pass, which finds them.
  bool admit() {
    const int64_t waiting = static_cast<int64_t>(prompts_.size()) - next_prompt_;
    int64_t count = std::min<int64_t>(waiting, static_cast<int64_t>(free_slots_.size()) / cfg_.n);
    // While rows decode, prompts join in groups of at least admission_rows samples (or all that wait).
    if (count > 0 && !rows_.empty() && count < waiting && count * cfg_.n < admission_rows_) return false;
    // Paged: the prompts whose samples' blocks fit too, in order; their blocks are taken now.
    std::vector<std::vector<int64_t>> block_sequences;
    std::vector<int64_t> cached(static_cast<size_t>(std::max<int64_t>(count, 0)), 0);  // positions found, per prompt
    if (blocks_) {
      int64_t fit = 0, past = 0, width = 0;
      while (fit < count) {
        const auto length = static_cast<int64_t>(prompt(fit).size());
        const int64_t most = length + cfg_.max_new_tokens - 1;
        std::vector<int64_t> found;
        if (takes_part_in_prefix_cache(next_prompt_ + fit)) {
          found = prefix_cache_->find(prompt(fit), *blocks_);
          if (finds_more_beside(fit, static_cast<int64_t>(found.size()))) break;
        }
        const auto found_blocks = static_cast<int64_t>(found.size());
        // The forward's rows x (cached + new) positions stay within max_num_batched_tokens (one prompt at least).
        const int64_t own_past = found_blocks * blocks_->block_size();
        if (fit > 0 && (fit + 1) * (std::max(past, own_past) + std::max(width, length - own_past)) >
                           cfg_.max_num_batched_tokens)
          break;
        if (!blocks_->can_admit(length, cfg_.n, most, found)) {
          HF_CHECK(fit > 0 || !rows_.empty(), "generation: a prompt of ", length, " tokens with n = ", cfg_.n,
                   " samples of up to ", cfg_.max_new_tokens, " new tokens needs ",
                   blocks_->worst_case_blocks(length, cfg_.n, most, found), " KV blocks of ",
                   blocks_->block_size(), " positions; the pool has ", blocks_->num_blocks(),
                   " (raise kv_cache_blocks, gpu_memory_utilization or the memory budget)");
          break;
        }
        block_sequences.push_back(blocks_->admit(length, cfg_.n, most, found));
        cached[static_cast<size_t>(fit)] = own_past;
        past = std::max(past, own_past);
        width = std::max(width, length - own_past);
        ++fit;
      }
      count = fit;
      cached.resize(static_cast<size_t>(count));
    }
    if (count <= 0) return false;
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    // Right-padded: every prompt's new ids start at the same column, at their own positions. Cached positions
    // (prefix caching) come gathered from their blocks, left-padded to the longest and masked.
    std::vector<const std::vector<int64_t>*> contexts;
    std::vector<int64_t> prompt_length;
    for (int64_t i = 0; i < count; ++i) {
      contexts.push_back(&prompt(i));
      prompt_length.push_back(static_cast<int64_t>(prompt(i).size()));
    }
    const PrefillRows in = prefill_rows(contexts, cached, cfg_.pad_token_id);
    const std::vector<int64_t>& last_position = in.last;  // each prompt's last id's column in the forward
    std::vector<std::vector<int64_t>> tables;
    if (blocks_)
      for (int64_t i = 0; i < count; ++i) tables.push_back(blocks_->table(block_sequences[static_cast<size_t>(i)][0]));
    KVCache prefill;
    prefill.capacity = in.width;
    if (in.past > 0) prefill = paged_.gather(tables, cached, in.past + in.width);
    link_.receive(count, in.width);
    ++prefills_;
    // Uploads pinned and queued behind the device's work (the running rows' last chunk), not blocking copies.
    torch::Tensor hidden = model_->hidden_states(upload(in.ids, device_), upload(in.mask, device_),
                                                 upload(in.positions, device_), &prefill);
    link_.send(hidden);
    // [count, width, layers, k]: prompt i's routing, shared by its samples.
    torch::Tensor prompt_routing;
    if (cfg_.record_routing)
      prompt_routing = torch::stack(model_->recorded_routing().layers, 2).to(torch::kCPU, torch::kInt32);

    // Each prompt's samples take the lowest free slots (the running rows stay packed at the front). A
    // continued generation (cfg.resume) sorts them: ended ones give their slot and blocks back below,
    // those with saved tokens get their prefixes prefilled, the others draw their first token here.
    std::vector<Row> admitted, continued, ended;
    std::vector<int64_t> slots, sources;
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < cfg_.n; ++j) {
        Row row;
        row.sequence = (next_prompt_ + i) * cfg_.n + j;
        row.slot = *free_slots_.begin();
        free_slots_.erase(free_slots_.begin());
        row.length = prompt_length[static_cast<size_t>(i)];
        if (blocks_) row.paged = block_sequences[static_cast<size_t>(i)][static_cast<size_t>(j)];
        if (cfg_.record_routing)
          prompt_routing_[static_cast<size_t>(row.sequence)] = prompt_routing[i].narrow(0, 0, row.length);
        const auto& saved = tokens_[static_cast<size_t>(row.sequence)];
        if (finished_[static_cast<size_t>(row.sequence)]) {
          ended.push_back(row);
        } else if (!saved.empty()) {
          row.token = saved.back();
          continued.push_back(row);
        } else {
          admitted.push_back(row);
          slots.push_back(row.slot);
          sources.push_back(i);
        }
      }
    if (blocks_) {
      write_to_blocks(prefill, tables, prompt_length, cached, in.shifts);
      for (int64_t i = 0; i < count; ++i) {
        prefix_cached_tokens_ += cached[static_cast<size_t>(i)];
        if (takes_part_in_prefix_cache(next_prompt_ + i))
          prefix_cache_->record(prompt(i), tables[static_cast<size_t>(i)],
                                prompt_length[static_cast<size_t>(i)] / blocks_->block_size(), *blocks_);
      }
    } else {
      copy_to_slots(prefill, slots, sources, in.width);
    }

    next_prompt_ += count;
    for (const Row& row : ended) {
      free_slots_.insert(row.slot);
      if (blocks_) blocks_->release(row.paged);
    }
    for (int64_t i = next_prompt_ - count; i < next_prompt_; ++i)
      if (group_left_[static_cast<size_t>(i)] == 0) hand_out(i);  // every sample ended before a stop
    if (!admitted.empty()) {
      torch::Tensor tokens, log_probs;
      if (link_.samples()) {
        const auto source_t = upload(torch::tensor(sources, i64), device_);
        const auto last_t = upload(torch::tensor(last_position, i64), device_);
        auto last = hidden.index({torch::arange(count, i64.device(device_)), last_t}).index_select(0, source_t);
        std::tie(tokens, log_probs) = choose(admitted, last);
      }
      link_.share(tokens, log_probs, static_cast<int64_t>(admitted.size()));
      const size_t first = rows_.size();
      rows_.insert(rows_.end(), admitted.begin(), admitted.end());
      take(first, tokens, log_probs);
    }
    if (!continued.empty()) continue_saved(continued);
    return true;
  }

  // cfg.resume: the saved state of every sequence, checked against this call's prompts and config.
  void take_saved(const PartialSequences& saved) {
    const auto total = static_cast<size_t>(total_);
    HF_CHECK(saved.tokens.size() == total && saved.log_probs.size() == total && saved.finished.size() == total &&
                 (saved.versions.empty() || saved.versions.size() == total),
             "generation: the saved partial generation holds ", saved.tokens.size(), " sequences, this call has ",
             total_, " (", prompts_.size(), " prompts x n = ", cfg_.n, ")");
    for (size_t q = 0; q < total; ++q) restore_sequence(static_cast<int64_t>(q), saved, q);
  }

  // StreamedPrompt::saved: the state of streamed prompt p's n samples.
  void take_saved_group(int64_t p, const PartialSequences& saved) {
    const auto n = static_cast<size_t>(cfg_.n);
    HF_CHECK(saved.tokens.size() == n && saved.log_probs.size() == n && saved.finished.size() == n &&
                 (saved.versions.empty() || saved.versions.size() == n),
             "generation: streamed prompt ", p, " comes with the saved state of ", saved.tokens.size(),
             " sequences; expected n = ", cfg_.n);
    for (size_t j = 0; j < n; ++j) {
      const int64_t q = p * cfg_.n + static_cast<int64_t>(j);
      restore_sequence(q, saved, j);
      if (finished_[static_cast<size_t>(q)]) --group_left_[static_cast<size_t>(p)];
    }
  }

  // Sequence q takes entry `from` of a saved state.
  void restore_sequence(int64_t q, const PartialSequences& saved, size_t from) {
    const auto drawn = static_cast<int64_t>(saved.tokens[from].size());
    HF_CHECK(drawn <= cfg_.max_new_tokens && saved.log_probs[from].size() == saved.tokens[from].size() &&
                 (saved.versions.empty() || saved.versions[from].size() == saved.tokens[from].size()),
             "generation: saved sequence ", q, " holds ", drawn, " tokens (at most max_new_tokens = ",
             cfg_.max_new_tokens, ") with ", saved.log_probs[from].size(), " log-probs");
    const auto at = static_cast<size_t>(q);
    tokens_[at] = saved.tokens[from];
    log_probs_[at] = saved.log_probs[from];
    if (!saved.versions.empty()) versions_[at] = saved.versions[from];
    // A sequence whose last token ended it is done, whatever the flag says.
    finished_[at] = saved.finished[from] || drawn == cfg_.max_new_tokens ||
                    (drawn > 0 && is_eos(cfg_, saved.tokens[from].back()));
  }

  // The admitted rows of sequences with saved tokens: their prefixes go into their caches (blocks taken
  // for every position but the last token's, which the next decode feeds) and they join the running rows.
  void continue_saved(std::vector<Row>& continued) {
    for (Row& row : continued) {
      const auto drawn = static_cast<int64_t>(tokens_[static_cast<size_t>(row.sequence)].size());
      if (blocks_)
        for (int64_t t = 0; t + 1 < drawn; ++t) {
          const BlockManager::Append where = blocks_->append(row.paged);
          if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
        }
      row.length += drawn - 1;
    }
    prefill_prefixes(continued);
    rows_.insert(rows_.end(), continued.begin(), continued.end());
    std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) { return a.slot < b.slot; });
  }

  // Partial rollouts: when the hook reports newer weights, the running sequences' caches hold keys and
  // values of the old ones; each sequence's prefix (its prompt and every token but the last, which the next
  // decode feeds) is prefilled again with the new weights, right-padded as in admit(), into its own slot or
  // blocks. A prompt's shared blocks are written by each of its samples with the same prompt positions.
  void refresh_weights() {
    if (!cfg_.refresh_weights) return;
    const int64_t version = cfg_.refresh_weights();
    const bool first = version_ < 0;
    if (version == version_) return;
    version_ = version;
    if (first || rows_.empty()) return;
    for (const Row& row : rows_) resumed_.insert(row.sequence);
    prefill_prefixes(rows_);
  }

  // Prefills each row's prefix (its prompt and its first length - prompt tokens drawn), right-padded as in
  // admit(), with the model's current weights into its own slot or blocks. A prompt's shared blocks are
  // written by each of its samples with the same prompt positions.
  void prefill_prefixes(const std::vector<Row>& rows) {
    const int64_t count = static_cast<int64_t>(rows.size());
    int64_t width = 0;
    for (const Row& row : rows) width = std::max(width, row.length);
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    auto ids = torch::full({count, width}, cfg_.pad_token_id, i64);
    auto mask = torch::zeros({count, width}, i64);
    std::vector<int64_t> slots, sources, lengths;
    std::vector<std::vector<int64_t>> tables;
    {
      auto id = ids.accessor<int64_t, 2>();
      auto m = mask.accessor<int64_t, 2>();
      for (int64_t i = 0; i < count; ++i) {
        const Row& row = rows[static_cast<size_t>(i)];
        const auto& p = prompts_[static_cast<size_t>(row.sequence / cfg_.n)];
        const auto& drawn = tokens_[static_cast<size_t>(row.sequence)];
        for (int64_t t = 0; t < row.length; ++t) {
          const auto plen = static_cast<int64_t>(p.size());
          id[i][t] = t < plen ? p[static_cast<size_t>(t)] : drawn[static_cast<size_t>(t - plen)];
          m[i][t] = 1;
        }
        slots.push_back(row.slot);
        sources.push_back(i);
        lengths.push_back(row.length);
        if (blocks_) tables.push_back(blocks_->table(row.paged));
      }
    }
    ids = upload(ids, device_);
    mask = upload(mask, device_);
    KVCache prefill;
    prefill.capacity = width;
    model_->hidden_states(ids, mask, position_ids_from_mask(mask), &prefill);
    if (blocks_)
      paged_.write_prefill(prefill, tables, lengths);
    else
      copy_to_slots(prefill, slots, sources, width);
  }

  // A chunk of decode steps, one token for every running sequence each, read back once at its end
  // (cfg.readback_interval). The inputs after the first step are the tokens drawn on the device; the host
  // advances the rows' lengths and blocks without reading them. A row that draws an eos id keeps decoding
  // to the chunk's end (its later tokens discarded, its extra blocks freed with the rest); the chunk ends
  // where a row reaches max_new_tokens, so no row writes past what it may hold.
  void decode() {
    const int64_t count = static_cast<int64_t>(rows_.size());
    int64_t steps = cfg_.readback_interval;
    std::vector<int64_t> inputs, slots, lengths, sequences, drawn;
    for (const Row& row : rows_) {
      inputs.push_back(row.token);
      slots.push_back(row.slot);
      lengths.push_back(row.length);
      sequences.push_back(row.sequence);
      drawn.push_back(static_cast<int64_t>(tokens_[static_cast<size_t>(row.sequence)].size()));
      steps = std::min(steps, cfg_.max_new_tokens - drawn.back());
    }
    const torch::Tensor uniforms = cfg_.greedy || !link_.samples()
                                       ? torch::Tensor()
                                       : sampling_uniforms(seeds_of(sequences), draw_ids_of(sequences), drawn, steps, device_);
    torch::Tensor input = upload(torch::tensor(inputs, torch::kInt64), device_);
    TokenRing ring(count, steps, cfg_, device_);
    std::vector<torch::Tensor> routing;  // per step [count, layers, k] on the device
    // Per step the host does O(rows) work besides copying the tables once: the graphs read each row's table
    // where the block manager keeps it (an append never moves another sequence's), and the eager step takes
    // copies (CausalLM::decode_paged's interface), into vectors kept across the chunk's steps.
    std::vector<const std::vector<int64_t>*> table_refs;
    std::vector<std::vector<int64_t>> tables;
    table_refs.reserve(static_cast<size_t>(count));
    const std::vector<torch::Tensor> uniforms_by_step = uniforms.defined() ? uniforms.unbind(0) : std::vector<torch::Tensor>();
    for (int64_t k = 0; k < steps; ++k) {
      link_.receive(count, 1);
      torch::Tensor hidden;
      if (blocks_) {
        table_refs.clear();
        for (const Row& row : rows_) {
          // Room for the input token's key and value; a shared block is copied before the step writes to it.
          const BlockManager::Append where = blocks_->append(row.paged);
          if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
          table_refs.push_back(&blocks_->table(row.paged));
        }
        if (!graphs_) {
          tables.resize(table_refs.size());
          for (size_t r = 0; r < table_refs.size(); ++r) tables[r].assign(table_refs[r]->begin(), table_refs[r]->end());
          hidden = model_->decode_paged(input.view({count, 1}), tables, lengths, paged_);
        }
      } else {
        hidden = model_->decode_slots(input.view({count, 1}), slots, lengths, cache_);
      }
      const torch::Tensor step_uniforms = uniforms.defined() ? uniforms_by_step[static_cast<size_t>(k)] : uniforms;
      TokenDraw draw;
      if (graphs_) {
        // One replay: the step and the draw (graphs run one stage, without routing records).
        draw = graphs_->decode_and_draw(input, step_uniforms, table_refs, lengths);
      } else {
        link_.send(hidden);
        if (cfg_.record_routing) routing.push_back(torch::stack(model_->recorded_routing().layers, 2).select(1, 0));
        if (link_.samples()) draw = choose_tokens_on_device(model_, hidden.select(1, 0), cfg_, step_uniforms);
      }
      for (int64_t& length : lengths) ++length;  // the input token is in the cache now
      link_.share(draw.tokens, draw.log_probs, count);
      ring.store(k, draw.tokens, draw.log_probs, draw.no_mass);
      input = draw.tokens;
    }
    const TokenRing::Chunk chunk = ring.read_back();
    ++host_syncs_;
    decode_steps_ += steps;
    torch::Tensor routed;
    if (!routing.empty()) routed = torch::stack(routing).to(torch::kCPU, torch::kInt32);  // [steps, count, layers, k]
    retire(chunk, routed);
  }

  // Records a chunk's counted tokens for each running row and retires the sequences that ended in it.
  void retire(const TokenRing::Chunk& chunk, const torch::Tensor& routed) {
    const auto tokens = chunk.tokens.accessor<int64_t, 2>();
    const auto log_probs = chunk.log_probs.accessor<float, 2>();
    const auto live = chunk.live.accessor<bool, 2>();
    const auto ended = chunk.ended.accessor<bool, 1>();
    std::vector<Row> running;
    for (size_t r = 0; r < rows_.size(); ++r) {
      Row row = rows_[r];
      const auto q = static_cast<size_t>(row.sequence);
      const auto i = static_cast<int64_t>(r);
      for (int64_t k = 0; k < tokens.size(0) && live[k][i]; ++k) {
        tokens_[q].push_back(tokens[k][i]);
        log_probs_[q].push_back(log_probs[k][i]);
        if (cfg_.refresh_weights) versions_[q].push_back(version_);
        // The routing of the step's input token, the row's response token number k so far.
        if (routed.defined()) response_routing_[q].push_back(routed[k][i]);
        row.token = tokens[k][i];
        ++row.length;
      }
      if (ended[i] || static_cast<int64_t>(tokens_[q].size()) == cfg_.max_new_tokens) {
        end_sequence(row.sequence);
        free_slots_.insert(row.slot);
        if (blocks_) blocks_->release(row.paged);
      } else {
        running.push_back(row);
      }
    }
    rows_ = std::move(running);
  }

  std::pair<torch::Tensor, torch::Tensor> choose(const std::vector<Row>& rows, const torch::Tensor& hidden) {
    std::vector<int64_t> sequences, steps;
    for (const Row& row : rows) {
      sequences.push_back(row.sequence);
      steps.push_back(static_cast<int64_t>(tokens_[static_cast<size_t>(row.sequence)].size()));
    }
    const torch::Tensor uniforms =
        cfg_.greedy ? torch::Tensor()
                    : sampling_uniforms(seeds_of(sequences), draw_ids_of(sequences), steps, 1, hidden.device()).squeeze(0);
    TokenDraw draw = choose_tokens_on_device(model_, hidden, cfg_, uniforms);
    check_sampleable(draw.no_mass);
    return {draw.tokens, draw.log_probs};
  }

  // The seed and the sequence number with which output row q draws (StreamedPrompt; the call's own rows:
  // cfg.seed and q).
  std::vector<uint64_t> seeds_of(const std::vector<int64_t>& sequences) const {
    std::vector<uint64_t> seeds;
    for (int64_t q : sequences) seeds.push_back(prompt_seed_[static_cast<size_t>(q / cfg_.n)]);
    return seeds;
  }
  std::vector<int64_t> draw_ids_of(const std::vector<int64_t>& sequences) const {
    std::vector<int64_t> ids;
    for (int64_t q : sequences) ids.push_back(prompt_first_sequence_[static_cast<size_t>(q / cfg_.n)] + q % cfg_.n);
    return ids;
  }

  // Streaming: asks cfg.next_prompts for prompts when slots are free for more groups than wait, or when
  // nothing runs or waits, and appends what it gives.
  void stream_in() {
    if (!cfg_.next_prompts) return;
    const int64_t waiting = static_cast<int64_t>(prompts_.size()) - next_prompt_;
    const bool idle = rows_.empty() && waiting == 0;
    const int64_t room = static_cast<int64_t>(free_slots_.size()) / cfg_.n - waiting;
    if (!idle && room <= 0) return;
    std::vector<StreamedPrompt> more = cfg_.next_prompts(std::max<int64_t>(room, 0), idle);
    const int64_t vocab = model_->config().vocab_size;
    for (StreamedPrompt& p : more) {
      const auto index = static_cast<int64_t>(prompts_.size());
      HF_CHECK(!p.ids.empty() && static_cast<int64_t>(p.ids.size()) <= streamed_longest_, "generation: streamed prompt ",
               index, " has ", p.ids.size(), " tokens; expected 1 to max_prompt_length = ", streamed_longest_);
      for (int64_t token : p.ids)
        HF_CHECK(token >= 0 && token < vocab, "generation: streamed prompt ", index, " has token id ", token,
                 " outside the vocabulary [0, ", vocab, ")");
      prompts_.push_back(std::move(p.ids));
      prompt_seed_.push_back(p.seed);
      prompt_first_sequence_.push_back(p.first_sequence);
      group_left_.push_back(cfg_.n);
      group_handed_.push_back(false);
      total_ += cfg_.n;
      tokens_.resize(static_cast<size_t>(total_));
      log_probs_.resize(static_cast<size_t>(total_));
      versions_.resize(static_cast<size_t>(total_));
      finished_.resize(static_cast<size_t>(total_), false);
      if (!p.saved.tokens.empty()) take_saved_group(index, p.saved);
    }
  }

  // Sequence q ended (eos or max_new_tokens): its group goes out when it was the last of its prompt's.
  void end_sequence(int64_t q) {
    finished_[static_cast<size_t>(q)] = true;
    const int64_t p = q / cfg_.n;
    if (--group_left_[static_cast<size_t>(p)] == 0) hand_out(p);
  }

  void hand_out(int64_t p) {
    if (!cfg_.on_group_finished || group_handed_[static_cast<size_t>(p)]) return;
    group_handed_[static_cast<size_t>(p)] = true;
    FinishedGroup group;
    group.prompt = p;
    for (int64_t q = p * cfg_.n; q < (p + 1) * cfg_.n; ++q) {
      const auto u = static_cast<size_t>(q);
      group.tokens.push_back(tokens_[u]);
      group.log_probs.push_back(log_probs_[u]);
      if (cfg_.refresh_weights) {
        group.versions.push_back(versions_[u]);
        group.begin_versions.push_back(versions_[u].empty() ? -1 : versions_[u].front());
      }
    }
    cfg_.on_group_finished(std::move(group));
  }

  // Records the tokens drawn for rows_[first..] and retires the sequences they end.
  void take(size_t first, const torch::Tensor& tokens, const torch::Tensor& log_probs) {
    // One read of the device for both (float64 holds the ids and the float32 log-probs exactly).
    const auto both = torch::stack({tokens.to(torch::kFloat64), log_probs.to(torch::kFloat64)}).to(torch::kCPU);
    ++host_syncs_;
    const auto tokens_cpu = both[0].to(torch::kInt64).contiguous();
    const auto log_probs_cpu = both[1].to(torch::kFloat32).contiguous();
    const int64_t* t = tokens_cpu.data_ptr<int64_t>();
    const float* lp = log_probs_cpu.data_ptr<float>();
    std::vector<Row> running(rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(first));
    for (size_t r = first; r < rows_.size(); ++r) {
      Row row = rows_[r];
      auto& generated = tokens_[static_cast<size_t>(row.sequence)];
      generated.push_back(t[r - first]);
      log_probs_[static_cast<size_t>(row.sequence)].push_back(lp[r - first]);
      if (cfg_.refresh_weights) versions_[static_cast<size_t>(row.sequence)].push_back(version_);
      row.token = t[r - first];
      if (is_eos(cfg_, row.token) || static_cast<int64_t>(generated.size()) == cfg_.max_new_tokens) {
        end_sequence(row.sequence);
        free_slots_.insert(row.slot);
        if (blocks_) blocks_->release(row.paged);
      } else {
        running.push_back(row);
      }
    }
    rows_ = std::move(running);
    // Slot order: when the running rows are exactly slots 0..k-1, attention reads the cache as a view.
    std::sort(rows_.begin(), rows_.end(), [](const Row& a, const Row& b) { return a.slot < b.slot; });
  }

  // Writes the prefill's positions [0, width) of row sources[k] into slot slots[k], every layer; makes the
  // slabs [slots, kv_heads, capacity, head_dim] on the first call. Zeros, not empty memory: a row's attention
  // may span positions past its own length (masked), and 0 x NaN would still be NaN.
  void copy_to_slots(const KVCache& prefill, const std::vector<int64_t>& slots, const std::vector<int64_t>& sources,
                     int64_t width) {
    const auto slot_t = upload(torch::tensor(slots, torch::kInt64), device_);
    const auto source_t = upload(torch::tensor(sources, torch::kInt64), device_);
    if (cache_.keys.empty()) {
      for (size_t l = 0; l < prefill.keys.size(); ++l) {
        const auto& k = prefill.keys[l];
        cache_.keys.push_back(zero_slab({slot_count_, k.size(1), capacity_, k.size(3)}, k.options()));
        cache_.values.push_back(zero_slab({slot_count_, k.size(1), capacity_, k.size(3)}, k.options()));
      }
    }
    for (size_t l = 0; l < prefill.keys.size(); ++l) {
      cache_.keys[l]
          .narrow(2, 0, width)
          .index_copy_(0, slot_t, prefill.keys[l].narrow(2, 0, width).index_select(0, source_t));
      cache_.values[l]
          .narrow(2, 0, width)
          .index_copy_(0, slot_t, prefill.values[l].narrow(2, 0, width).index_select(0, source_t));
    }
  }

  // Writes each admitted prompt's prefill into its blocks (once, whatever its n); makes the pools
  // [blocks, kv_heads, block_size, head_dim] on the first call, zeros as the slabs.
  void write_to_blocks(const KVCache& prefill, const std::vector<std::vector<int64_t>>& tables,
                       const std::vector<int64_t>& lengths, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& shifts) {
    if (paged_.keys.empty() && kept_) {
      // An earlier call's pools: their keys and values are that call's, finite numbers that the masked reads
      // past a row's length weigh by zero, as they do the zeros of new pools.
      paged_ = std::move(kept_->pools);
      graphs_ = std::move(kept_->graphs);
      if (graphs_) graphs_->rebind(paged_);
      graphs_taken_ = graphs_ ? graphs_->captured() : 0;
      kept_pools_ = true;
      set_max_span_ = kept_->max_span;
      set_max_rows_ = kept_->max_rows;
      kept_.reset();
    }
    if (paged_.keys.empty()) {
      // CUDA graphs pad their steps with rows that write to one more block, which no sequence owns.
      const bool graphs = cfg_.cuda_graphs && device_.is_cuda() && model_->decodes_on_device() &&
                          !cfg_.refresh_weights && !cfg_.record_routing;
      for (const auto& k : prefill.keys) {
        const std::vector<int64_t> sizes = {blocks_->num_blocks() + (graphs ? 1 : 0), k.size(1), blocks_->block_size(),
                                            k.size(3)};
        paged_.keys.push_back(zero_slab(sizes, k.options()));
        paged_.values.push_back(zero_slab(sizes, k.options()));
      }
      set_max_span_ = capacity_;
      set_max_rows_ = graph_rows();
      if (graphs)
        graphs_ = std::make_unique<DecodeGraphs>(
            model_, paged_,
            DecodeGraphPlan::Options{.block_size = blocks_->block_size(),
                                     .max_rows = set_max_rows_,
                                     .max_span = set_max_span_,
                                     .span_headroom = model_->decode_attends_row_lengths(paged_) ? 2 : 1},
            blocks_->num_blocks(), cfg_.pad_token_id, cfg_);
    }
    paged_.write_prefill(prefill, tables, lengths, starts, shifts);
  }

  // Whether prompt p finds and records prefixes: prefix caching is on and none of its samples comes with saved
  // tokens (a continued sample prefills its own prefix again, over the prompt's blocks).
  bool takes_part_in_prefix_cache(int64_t p) const {
    if (!prefix_cache_) return false;
    for (int64_t q = p * cfg_.n; q < (p + 1) * cfg_.n; ++q)
      if (finished_[static_cast<size_t>(q)] || !tokens_[static_cast<size_t>(q)].empty()) return false;
    return true;
  }

  // Whether waiting prompt `offset` begins with more whole blocks (as many as find() may return) of a prompt
  // admitted before it in this pass than the `found` blocks held now.
  bool finds_more_beside(int64_t offset, int64_t found) const {
    for (int64_t earlier = 0; earlier < offset; ++earlier)
      if (takes_part_in_prefix_cache(next_prompt_ + earlier) &&
          prefix_cache_->blocks_in_common(prompt(offset), prompt(earlier)) > found)
        return true;
    return false;
  }

  // GenerationOutput::routed_experts for prompts left-padded to `prompt_width` and `response_width` columns
  // of responses, on the CPU.
  torch::Tensor routed_experts(int64_t prompt_width, int64_t response_width) const {
    const ModelConfig& c = model_->config();
    auto out = torch::full({total_, prompt_width + response_width, c.num_moe_layers(), c.moe.num_experts_per_tok}, -1,
                           torch::TensorOptions().dtype(torch::kInt32));
    for (int64_t q = 0; q < total_; ++q) {
      const torch::Tensor& prompt_part = prompt_routing_[static_cast<size_t>(q)];
      if (!prompt_part.defined()) continue;  // max_new_tokens = 0: nothing ran
      out[q].narrow(0, prompt_width - prompt_part.size(0), prompt_part.size(0)).copy_(prompt_part);
      const auto& steps = response_routing_[static_cast<size_t>(q)];
      for (size_t t = 0; t < steps.size(); ++t) out[q][prompt_width + static_cast<int64_t>(t)].copy_(steps[t]);
    }
    return out;
  }

  // The most rows a decode graph holds (more run eagerly).
  int64_t graph_rows() const { return std::min<int64_t>(slot_count_, 512); }

  const std::vector<int64_t>& prompt(int64_t offset) const {
    return prompts_[static_cast<size_t>(next_prompt_ + offset)];
  }

  CausalLM& model_;
  std::vector<std::vector<int64_t>> prompts_;  // the call's, then the streamed ones (cfg.next_prompts)
  const GenerationConfig& cfg_;
  StageLink link_;
  torch::Device device_;
  int64_t total_ = 0, slot_count_ = 0, capacity_ = 0;
  int64_t next_prompt_ = 0;
  // Per prompt: the seed and first sequence number of its samples' draws, its samples still running or
  // waiting, and whether cfg.on_group_finished has had it.
  std::vector<uint64_t> prompt_seed_;
  std::vector<int64_t> prompt_first_sequence_;
  std::vector<int64_t> group_left_;
  std::vector<bool> group_handed_;
  int64_t streamed_longest_ = 0;  // streaming: the longest prompt the cache holds (cfg.max_prompt_length)
  std::set<int64_t> free_slots_;
  std::vector<Row> rows_;
  KVCache cache_;
  std::optional<BlockManager> blocks_;  // paged cache only
  std::optional<PrefixCache> prefix_cache_;  // paged cache with cfg.enable_prefix_caching (see the constructor)
  int64_t prefix_cached_tokens_ = 0;        // prompt positions found in other prompts' blocks
  PagedKVCache paged_;
  std::unique_ptr<DecodeGraphs> graphs_;  // paged cache with cfg.cuda_graphs on a CUDA device
  // cfg.decode_graph_cache: the set taken from it until the first prefill adopts it, what it was made for,
  // the graphs it came with and whether this call's pools are an earlier call's.
  std::optional<KeptDecodeGraphs> kept_;
  std::vector<int64_t> fingerprint_;
  int64_t set_max_span_ = 0, set_max_rows_ = 0, graphs_taken_ = 0;
  bool kept_pools_ = false;
  std::vector<std::vector<int64_t>> tokens_;  // per sequence
  std::vector<std::vector<float>> log_probs_;
  std::vector<bool> finished_;  // per sequence: ended (eos or max_new_tokens)
  bool stopped_ = false;        // cfg.stop_requested stopped the run before every sequence ended
  int64_t host_syncs_ = 0, decode_steps_ = 0, prefills_ = 0;  // GenerationOutput's counts
  int64_t admission_rows_ = 0;  // GenerationConfig::admission_rows, the default resolved
  // Partial rollouts (cfg.refresh_weights): the weights' version (-1 before the first round), each token's
  // version, and the sequences prefilled again with newer weights.
  int64_t version_ = -1;
  std::vector<std::vector<int64_t>> versions_;
  std::set<int64_t> resumed_;
  // Router recording, per sequence: its prompt's routing [prompt tokens, layers, k] and, per decode step,
  // its input token's [layers, k].
  std::vector<torch::Tensor> prompt_routing_;
  std::vector<std::vector<torch::Tensor>> response_routing_;
};

}  // namespace

GenerationOutput generate_continuous(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const GenerationConfig& cfg, Communicator* stages) {
  Scheduler scheduler(model, prompts, cfg, stages);
  if (cfg.max_new_tokens > 0) scheduler.run();
  GenerationOutput out = scheduler.output(pad_prompts(scheduler.prompts(), cfg, model->parameters().front().device()));
  scheduler.keep_for_next_call();
  return out;
}

}  // namespace hybridflow::generation
