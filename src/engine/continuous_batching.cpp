// Continuous batching: a fixed number of KV-cache slots, each holding one sequence from position 0 (no
// padding). Whenever a prompt's n samples fit in the free slots, waiting prompts are prefilled together,
// once each, and their keys and values copied to their samples' slots; every step then decodes one token
// for each running sequence at its own position (CausalLM::decode_slots), and a sequence that ends frees
// its slot at once. Nothing is gathered or compacted when sequences end: rows just stop naming their slot.
//
// Every pipeline stage runs this same schedule: the last stage's tokens reach all stages (StageLink), and
// the schedule depends on nothing else.
#include <sys/mman.h>

#include <algorithm>
#include <set>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"

namespace hybridflow::generation {
namespace {

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
           " bytes for the KV cache (max_num_seqs sets its rows)");
  return torch::from_blob(
      memory, sizes, [bytes](void* p) { munmap(p, std::max<size_t>(bytes, 1)); }, options);
}

// A running sequence.
struct Row {
  int64_t sequence = 0;  // output row: prompt i's sample j is i * n + j
  int64_t slot = 0;
  int64_t length = 0;  // positions in its slot's cache
  int64_t token = 0;   // the last token drawn: the next step's input
};

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
        log_probs_(static_cast<size_t>(total_)) {
    int64_t longest_prompt = 0;
    for (const auto& p : prompts) longest_prompt = std::max<int64_t>(longest_prompt, static_cast<int64_t>(p.size()));
    capacity_ = longest_prompt + cfg.max_new_tokens;
    const int64_t slots = std::min(total_, std::max(cfg.n, cfg.max_num_seqs > 0 ? cfg.max_num_seqs : total_));
    slot_count_ = slots;
    for (int64_t s = 0; s < slots; ++s) free_slots_.insert(s);
  }

  void run() {
    while (true) {
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
    return out;
  }

 private:
  // Prefills as many waiting prompts as have room for all their samples; false when none has.
  bool admit() {
    const int64_t waiting = static_cast<int64_t>(prompts_.size()) - next_prompt_;
    const int64_t count = std::min<int64_t>(waiting, static_cast<int64_t>(free_slots_.size()) / cfg_.n);
    if (count <= 0) return false;
    const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
    // Right-padded: every prompt starts at position 0, as in its slot.
    int64_t width = 0;
    for (int64_t i = 0; i < count; ++i) width = std::max<int64_t>(width, static_cast<int64_t>(prompt(i).size()));
    auto ids = torch::full({count, width}, cfg_.pad_token_id, i64);
    auto mask = torch::zeros({count, width}, i64);
    std::vector<int64_t> last_position(static_cast<size_t>(count));
    {
      auto id = ids.accessor<int64_t, 2>();
      auto m = mask.accessor<int64_t, 2>();
      for (int64_t i = 0; i < count; ++i) {
        const auto& p = prompt(i);
        for (size_t t = 0; t < p.size(); ++t) {
          id[i][static_cast<int64_t>(t)] = p[t];
          m[i][static_cast<int64_t>(t)] = 1;
        }
        last_position[static_cast<size_t>(i)] = static_cast<int64_t>(p.size()) - 1;
      }
    }
    ids = ids.to(device_);
    mask = mask.to(device_);
    link_.receive(count, width);
    KVCache prefill;
    prefill.capacity = width;
    torch::Tensor hidden = model_->hidden_states(ids, mask, position_ids_from_mask(mask), &prefill);
    link_.send(hidden);

    // Each prompt's samples take the lowest free slots (the running rows stay packed at the front).
    std::vector<Row> admitted;
    std::vector<int64_t> slots, sources;
    for (int64_t i = 0; i < count; ++i)
      for (int64_t j = 0; j < cfg_.n; ++j) {
        Row row;
        row.sequence = (next_prompt_ + i) * cfg_.n + j;
        row.slot = *free_slots_.begin();
        free_slots_.erase(free_slots_.begin());
        row.length = last_position[static_cast<size_t>(i)] + 1;
        admitted.push_back(row);
        slots.push_back(row.slot);
        sources.push_back(i);
      }
    copy_to_slots(prefill, slots, sources, width);

    torch::Tensor tokens, log_probs;
    if (link_.samples()) {
      const auto source_t = torch::tensor(sources, i64).to(device_);
      const auto last_t = torch::tensor(last_position, i64).to(device_);
      auto last = hidden.index({torch::arange(count, i64.device(device_)), last_t}).index_select(0, source_t);
      std::tie(tokens, log_probs) = choose(admitted, last);
    }
    link_.share(tokens, log_probs, static_cast<int64_t>(admitted.size()));
    next_prompt_ += count;
    const size_t first = rows_.size();
    rows_.insert(rows_.end(), admitted.begin(), admitted.end());
    take(first, tokens, log_probs);
    return true;
  }

  // One token for every running sequence.
  void decode() {
    const int64_t count = static_cast<int64_t>(rows_.size());
    std::vector<int64_t> inputs, slots, lengths;
    for (const Row& row : rows_) {
      inputs.push_back(row.token);
      slots.push_back(row.slot);
      lengths.push_back(row.length);
    }
    link_.receive(count, 1);
    auto ids = torch::tensor(inputs, torch::TensorOptions().dtype(torch::kInt64)).view({count, 1}).to(device_);
    torch::Tensor hidden = model_->decode_slots(ids, slots, lengths, cache_);
    link_.send(hidden);
    for (Row& row : rows_) ++row.length;  // the input token is in the cache now
    torch::Tensor tokens, log_probs;
    if (link_.samples()) std::tie(tokens, log_probs) = choose(rows_, hidden.select(1, 0));
    link_.share(tokens, log_probs, count);
    take(0, tokens, log_probs);
  }

  std::pair<torch::Tensor, torch::Tensor> choose(const std::vector<Row>& rows, const torch::Tensor& hidden) {
    std::vector<int64_t> sequences, steps;
    for (const Row& row : rows) {
      sequences.push_back(row.sequence);
      steps.push_back(static_cast<int64_t>(tokens_[static_cast<size_t>(row.sequence)].size()));
    }
    return choose_tokens(model_, hidden, cfg_, sequences, steps);
  }

  // Records the tokens drawn for rows_[first..] and retires the sequences they end.
  void take(size_t first, const torch::Tensor& tokens, const torch::Tensor& log_probs) {
    const auto tokens_cpu = tokens.to(torch::kCPU, torch::kInt64).contiguous();
    const auto log_probs_cpu = log_probs.to(torch::kCPU, torch::kFloat32).contiguous();
    const int64_t* t = tokens_cpu.data_ptr<int64_t>();
    const float* lp = log_probs_cpu.data_ptr<float>();
    std::vector<Row> running(rows_.begin(), rows_.begin() + static_cast<std::ptrdiff_t>(first));
    for (size_t r = first; r < rows_.size(); ++r) {
      Row row = rows_[r];
      auto& generated = tokens_[static_cast<size_t>(row.sequence)];
      generated.push_back(t[r - first]);
      log_probs_[static_cast<size_t>(row.sequence)].push_back(lp[r - first]);
      row.token = t[r - first];
      if (is_eos(cfg_, row.token) || static_cast<int64_t>(generated.size()) == cfg_.max_new_tokens) {
        free_slots_.insert(row.slot);
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
    const auto slot_t = torch::tensor(slots, torch::kInt64).to(device_);
    const auto source_t = torch::tensor(sources, torch::kInt64).to(device_);
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

  const std::vector<int64_t>& prompt(int64_t offset) const {
    return prompts_[static_cast<size_t>(next_prompt_ + offset)];
  }

  CausalLM& model_;
  const std::vector<std::vector<int64_t>>& prompts_;
  const GenerationConfig& cfg_;
  StageLink link_;
  torch::Device device_;
  int64_t total_ = 0, slot_count_ = 0, capacity_ = 0;
  int64_t next_prompt_ = 0;
  std::set<int64_t> free_slots_;
  std::vector<Row> rows_;
  KVCache cache_;
  std::vector<std::vector<int64_t>> tokens_;  // per sequence
  std::vector<std::vector<float>> log_probs_;
};

}  // namespace

GenerationOutput generate_continuous(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts,
                                     const GenerationConfig& cfg, Communicator* stages) {
  const PromptBatch padded = pad_prompts(prompts, cfg, model->parameters().front().device());
  Scheduler scheduler(model, prompts, cfg, stages);
  if (cfg.max_new_tokens > 0) scheduler.run();
  return scheduler.output(padded);
}

}  // namespace hybridflow::generation
