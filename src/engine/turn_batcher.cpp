// Continuous batching of conversation turns with cached-prefix resume; see engine/turn_batcher.h.
#include "hybridflow/engine/turn_batcher.h"

#include <algorithm>
#include <tuple>

#include "engine/generation_steps.h"
#include "hybridflow/core/error.h"
#include "hybridflow/parallel/collectives.h"

namespace hybridflow {

struct TurnBatcher::Conversation {
  std::vector<int64_t> cached;  // the ids whose keys and values its blocks hold, positions [0, size)
  int64_t sequence = -1;        // its sequence in the block manager; -1 when it holds no blocks
  int64_t max_positions = 0;    // its first context + the response budget
  int64_t turns = 0;            // turns submitted so far
  std::vector<int64_t> context;  // the queued turn's
  int64_t max_new_tokens = 0;
  bool queued = false, running = false;
  bool shared_pending = false;  // holds its group's shared prompt and has not started from it yet
  bool released = false;        // released before its group's admission: not a member of it
};

struct TurnBatcher::Group {
  bool admitted = false;     // its members hold the shared prompt (or were admitted alone)
  torch::Tensor last_hidden;  // the prompt's last position [1, hidden], while a member has yet to start
  int64_t pending = 0;        // members holding the prompt that have not started from it
};

struct TurnBatcher::Running {
  int64_t conversation = 0;
  int64_t turn = 0;   // the conversation's turn number
  int64_t token = 0;  // the last token drawn: the next step's input
  int64_t max_new_tokens = 0;
  std::vector<int64_t> ids;
  std::vector<float> log_probs;
};

TurnBatcher::TurnBatcher(CausalLM& model, const GenerationConfig& cfg, int64_t conversations, int64_t group_size,
                         Communicator* stages)
    : model_(model),
      stages_(stages),
      cfg_(cfg),
      was_training_(model->is_training()),
      fixed_pool_(generation::given_pool_blocks(model, cfg)),
      blocks_(std::max<int64_t>(fixed_pool_, 1), cfg.kv_block_size) {
  HF_CHECK(conversations >= 0, "TurnBatcher: ", conversations, " conversations");
  HF_CHECK(model->head_kind() == HeadKind::kLanguageModel, "TurnBatcher: the model has a value head");
  const PipelineStage& stage = model->pipeline_stage();
  HF_CHECK(!stage.enabled() || (stages != nullptr && stages->size() == stage.stages && stages->rank() == stage.stage),
           "TurnBatcher: the model is pipeline stage ", stage.stage, " of ", stage.stages,
           " and needs the communicator over its stages (one rank per stage, in stage order)");
  HF_CHECK(!stage.enabled() || !model->tensor_parallel().enabled(), "TurnBatcher: multi-turn continuous batching ",
           "runs pipeline stages or tensor-parallel ranks, not both (pipeline size ", stage.stages,
           ", tensor-parallel size ", model->tensor_parallel().size(), ")");
  HF_CHECK(group_size >= 1, "TurnBatcher: group_size (episodes per prompt) must be >= 1, got ", group_size);
  HF_CHECK(cfg.max_new_tokens >= 1, "TurnBatcher: max_new_tokens (the response budget) must be >= 1, got ",
           cfg.max_new_tokens);
  HF_CHECK(cfg.greedy || cfg.temperature > 0, "TurnBatcher: temperature must be > 0 when sampling, got ",
           cfg.temperature);
  for (int64_t c = 0; c < conversations; ++c) conversations_.push_back(std::make_unique<Conversation>());
  group_size_ = group_size;
  groups_.resize(static_cast<size_t>((conversations + group_size - 1) / group_size));
  model->eval();
}

TurnBatcher::~TurnBatcher() { model_->train(was_training_); }

void TurnBatcher::submit(int64_t conversation, std::vector<int64_t> context, int64_t max_new_tokens) {
  const auto count = static_cast<int64_t>(conversations_.size());
  HF_CHECK(conversation >= 0 && conversation < count, "TurnBatcher: no conversation ", conversation, " of ", count);
  Conversation& c = *conversations_[static_cast<size_t>(conversation)];
  HF_CHECK(!c.queued && !c.running, "TurnBatcher: conversation ", conversation, " already has a turn under way");
  HF_CHECK(!context.empty(), "TurnBatcher: conversation ", conversation, "'s context is empty");
  HF_CHECK(max_new_tokens >= 1, "TurnBatcher: a turn may have ", max_new_tokens, " new tokens; at least 1 is needed");
  const int64_t vocab = model_->config().vocab_size;
  for (int64_t id : context)
    HF_CHECK(id >= 0 && id < vocab, "TurnBatcher: conversation ", conversation, " has token id ", id,
             " outside the vocabulary [0, ", vocab, ")");
  if (c.turns == 0 || c.max_positions == 0) c.max_positions = static_cast<int64_t>(context.size()) + cfg_.max_new_tokens;
  const int64_t needs = static_cast<int64_t>(context.size()) + max_new_tokens - 1;
  HF_CHECK(needs <= c.max_positions, "TurnBatcher: conversation ", conversation, "'s turn of ", context.size(),
           " context ids and up to ", max_new_tokens, " new tokens passes its ", c.max_positions,
           " positions (its first context + max_new_tokens, the response budget)");
  c.context = std::move(context);
  c.max_new_tokens = max_new_tokens;
  c.queued = true;
  queued_.push_back(conversation);
}

bool TurnBatcher::idle() const { return queued_.empty() && running_.empty(); }

int64_t TurnBatcher::running_turns() const { return static_cast<int64_t>(running_.size()); }

int64_t TurnBatcher::held_blocks() const { return blocks_.used_blocks(); }

void TurnBatcher::release(int64_t conversation) {
  HF_CHECK(conversation >= 0 && conversation < static_cast<int64_t>(conversations_.size()), "TurnBatcher: no conversation ",
           conversation);
  Conversation& c = *conversations_[static_cast<size_t>(conversation)];
  leave_group_share(conversation);
  if (c.sequence >= 0) blocks_.release(c.sequence);
  if (c.turns == 0) c.released = true;
  c.sequence = -1;
  c.cached.clear();
  c.queued = c.running = false;
  queued_.erase(std::remove(queued_.begin(), queued_.end(), conversation), queued_.end());
  running_.erase(std::remove_if(running_.begin(), running_.end(),
                                [&](const Running& r) { return r.conversation == conversation; }),
                 running_.end());
}

void TurnBatcher::grow_pool(int64_t blocks) {
  const int64_t added = std::max(blocks, blocks_.num_blocks());  // doubling: copies stay linear in the total
  blocks_.add_blocks(added);
  for (auto* pools : {&paged_.keys, &paged_.values})
    for (auto& pool : *pools) {
      auto more = generation::zero_slab({added, pool.size(1), pool.size(2), pool.size(3)}, pool.options());
      pool = torch::cat({pool, more}, 0);
    }
}

// Room for `members` sequences sharing a first context of `positions` ids, each of up to max_positions: true
// when the free, unreserved blocks cover their worst case, after growing a pool that grows on demand.
bool TurnBatcher::room_for(int64_t positions, int64_t members, int64_t max_positions) {
  if (blocks_.can_admit(positions, members, max_positions)) return true;
  if (fixed_pool_ > 0) return false;
  grow_pool(blocks_.worst_case_blocks(positions, members, max_positions) -
            (blocks_.free_blocks() - blocks_.reserved_blocks()));
  return true;
}

// Starts conversation `id`'s queued turn: from its group's shared prompt, by a delta prefill when its context
// extends what its blocks hold, else (its first turn, or a context that does not extend the cache) admission
// and a prefill of the whole context. Returns the hidden state of its last context position [1, hidden], or
// nothing when its blocks do not fit yet.
std::optional<torch::Tensor> TurnBatcher::start(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  if (c.turns == 0 && group_size_ > 1) {
    if (c.shared_pending) {
      if (c.context == c.cached) return start_shared(id);
      // A first context other than the group's prompt: the share goes back, the conversation is admitted alone.
      leave_group_share(id);
      blocks_.release(c.sequence);
      c.sequence = -1;
      c.cached.clear();
    } else if (c.sequence < 0 && !groups_[static_cast<size_t>(id / group_size_)].admitted) {
      return admit_group(id);
    }
  }
  const auto cached = static_cast<int64_t>(c.cached.size());
  const bool extends = c.sequence >= 0 && static_cast<int64_t>(c.context.size()) > cached &&
                       std::equal(c.cached.begin(), c.cached.end(), c.context.begin());
  if (extends) return prefill(id, cached);
  if (c.sequence >= 0) {
    blocks_.release(c.sequence);
    c.sequence = -1;
    c.cached.clear();
    ++stats_.full_prefills;
  }
  const auto length = static_cast<int64_t>(c.context.size());
  if (!room_for(length, 1, c.max_positions)) {
    HF_CHECK(held_blocks() > 0, "multi-turn generation: a conversation of up to ", c.max_positions,
             " positions needs ", blocks_.worst_case_blocks(length, 1, c.max_positions), " KV blocks of ",
             blocks_.block_size(), " positions; the pool has ", blocks_.num_blocks(),
             " (raise kv_cache_blocks, gpu_memory_utilization or the memory budget)");
    return std::nullopt;  // waits for a conversation to end
  }
  c.sequence = blocks_.admit(length, 1, c.max_positions).front();
  // The admission counted the context's positions as held; the prefill writes them.
  return prefill(id, 0);
}

// The first of group members to start: admits the group's live members on its first context (each takes a
// reference to the prompt's blocks), prefills it once and keeps its last hidden state for the others.
std::optional<torch::Tensor> TurnBatcher::admit_group(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  Group& g = groups_[static_cast<size_t>(id / group_size_)];
  const int64_t first = id / group_size_ * group_size_;
  const int64_t last = std::min<int64_t>(first + group_size_, static_cast<int64_t>(conversations_.size()));
  std::vector<int64_t> members;
  for (int64_t m = first; m < last; ++m) {
    const Conversation& other = *conversations_[static_cast<size_t>(m)];
    if (m == id || (!other.released && other.turns == 0 && other.sequence < 0)) members.push_back(m);
  }
  const auto length = static_cast<int64_t>(c.context.size());
  const auto count = static_cast<int64_t>(members.size());
  if (count == 1 || !room_for(length, count, c.max_positions)) {
    if (count > 1 && held_blocks() > 0) return std::nullopt;  // waits for blocks to free
    // One member left, or a group larger than the whole pool: its members are admitted one by one.
    g.admitted = true;
    return start(id);
  }
  const std::vector<int64_t> sequences = blocks_.admit(length, count, c.max_positions);
  for (size_t k = 0; k < members.size(); ++k) {
    Conversation& m = *conversations_[static_cast<size_t>(members[k])];
    m.sequence = sequences[k];
    if (members[k] == id) continue;
    m.cached = c.context;
    m.shared_pending = true;
    if (!m.queued) m.max_positions = c.max_positions;  // its own first context sets it when it comes
    ++g.pending;
  }
  g.admitted = true;
  torch::Tensor hidden = prefill(id, 0);
  if (g.pending > 0) g.last_hidden = hidden;
  return hidden;
}

// A member whose first context is its group's prompt: its first token comes from the shared prefill's last
// hidden state, the one its own prefill of the same ids would compute.
torch::Tensor TurnBatcher::start_shared(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  const torch::Tensor hidden = groups_[static_cast<size_t>(id / group_size_)].last_hidden;
  const auto length = static_cast<int64_t>(c.cached.size());
  stats_.shared_prompt_tokens += length;
  stats_.shared_prompt_blocks += length / blocks_.block_size();
  leave_group_share(id);
  begin_turn(id);
  return hidden;
}

void TurnBatcher::leave_group_share(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  if (!c.shared_pending) return;
  c.shared_pending = false;
  Group& g = groups_[static_cast<size_t>(id / group_size_)];
  if (--g.pending == 0) g.last_hidden = torch::Tensor();
}

void TurnBatcher::begin_turn(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  c.queued = false;
  c.running = true;
  Running row;
  row.conversation = id;
  row.turn = c.turns++;
  row.max_new_tokens = c.max_new_tokens;
  running_.push_back(std::move(row));
  c.context.clear();
  c.context.shrink_to_fit();
}

torch::Tensor TurnBatcher::prefill(int64_t id, int64_t from) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  const auto total = static_cast<int64_t>(c.context.size());
  const int64_t count = total - from;
  KVCache cache = from > 0 ? paged_.gather(blocks_.table(c.sequence), from) : KVCache{};
  cache.capacity = total;
  if (from > 0)
    for (int64_t t = 0; t < count; ++t) {
      const BlockManager::Append where = blocks_.append(c.sequence);
      if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
    }
  const auto device = model_->parameters().front().device();
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64);
  const auto ids = torch::tensor(std::vector<int64_t>(c.context.begin() + from, c.context.end()), i64).view({1, count}).to(device);
  const auto mask = torch::ones({1, total}, i64.device(device));
  const auto positions = torch::arange(from, total, i64.device(device)).view({1, count});
  generation::StageLink link(model_, stages_);
  link.receive(1, count);
  const torch::Tensor hidden = model_->hidden_states(ids, mask, positions, &cache);
  link.send(hidden);
  if (paged_.keys.empty())
    for (const auto& k : cache.keys) {
      const std::vector<int64_t> sizes = {blocks_.num_blocks(), k.size(1), blocks_.block_size(), k.size(3)};
      paged_.keys.push_back(generation::zero_slab(sizes, k.options()));
      paged_.values.push_back(generation::zero_slab(sizes, k.options()));
    }
  paged_.write_prefill(cache, {blocks_.table(c.sequence)}, {total}, {from});
  stats_.prefill_tokens += count;
  stats_.reused_tokens += from;
  c.cached = c.context;
  begin_turn(id);
  return hidden.select(1, count - 1);
}

void TurnBatcher::record(Running& row, int64_t token, float log_prob, std::vector<BatchedTurn>& ended) {
  row.ids.push_back(token);
  row.log_probs.push_back(log_prob);
  row.token = token;
  if (!generation::is_eos(cfg_, token) && static_cast<int64_t>(row.ids.size()) < row.max_new_tokens) return;
  conversations_[static_cast<size_t>(row.conversation)]->running = false;
  ++stats_.turns;
  ended.push_back(BatchedTurn{row.conversation, std::move(row.ids), std::move(row.log_probs)});
  row.ids.clear();
  row.max_new_tokens = 0;  // marks the row as ended
}

std::vector<BatchedTurn> TurnBatcher::step() {
  torch::NoGradGuard no_grad;
  std::vector<BatchedTurn> ended;
  const auto count = static_cast<int64_t>(conversations_.size());
  auto draw = [&](const std::vector<size_t>& rows, const torch::Tensor& hidden) {
    std::vector<int64_t> sequences, steps;
    for (size_t r : rows) {
      sequences.push_back(running_[r].turn * count + running_[r].conversation);
      steps.push_back(static_cast<int64_t>(running_[r].ids.size()));
    }
    // With stages the last one draws and every stage takes its tokens (the others' hidden is their output).
    generation::StageLink link(model_, stages_);
    torch::Tensor tokens, log_probs;
    if (link.samples()) std::tie(tokens, log_probs) = generation::choose_tokens(model_, hidden, cfg_, sequences, steps);
    link.share(tokens, log_probs, static_cast<int64_t>(rows.size()));
    torch::Tensor chosen = tokens.to(torch::kInt64).contiguous();
    // Under tensor parallelism every rank draws from the same gathered logits; rank 0's choice is taken
    // anyway, so that the ranks' caches and turn ends cannot drift apart by a rounding.
    if (model_->tensor_parallel().enabled()) model_->tensor_parallel().comm()->broadcast(chosen, 0);
    const auto t = chosen.to(torch::kCPU).contiguous();
    const auto lp = log_probs.to(torch::kCPU, torch::kFloat32).contiguous();
    for (size_t k = 0; k < rows.size(); ++k)
      record(running_[rows[k]], t.data_ptr<int64_t>()[k], lp.data_ptr<float>()[k], ended);
  };

  // Queued turns, in the order they came, as far as the running limit and the blocks allow; each prefilled
  // alone, its first token drawn from its last position.
  std::deque<int64_t> waiting;
  for (int64_t id : queued_) {
    const bool room = cfg_.max_num_seqs <= 0 || static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs;
    const std::optional<torch::Tensor> last = room ? start(id) : std::nullopt;
    if (!last) {
      waiting.push_back(id);
      continue;
    }
    draw({running_.size() - 1}, *last);
  }
  queued_ = std::move(waiting);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const Running& r) { return r.max_new_tokens == 0; }),
                 running_.end());
  if (running_.empty()) return ended;

  // One token for every running turn, at its conversation's own length.
  std::vector<int64_t> inputs, lengths;
  std::vector<std::vector<int64_t>> tables;
  for (const Running& row : running_) {
    Conversation& c = *conversations_[static_cast<size_t>(row.conversation)];
    const BlockManager::Append where = blocks_.append(c.sequence);
    if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
    inputs.push_back(row.token);
    lengths.push_back(static_cast<int64_t>(c.cached.size()));
    tables.push_back(blocks_.table(c.sequence));
  }
  const auto rows = static_cast<int64_t>(running_.size());
  const auto device = model_->parameters().front().device();
  const auto ids = torch::tensor(inputs, torch::TensorOptions().dtype(torch::kInt64)).view({rows, 1}).to(device);
  generation::StageLink link(model_, stages_);
  link.receive(rows, 1);
  const torch::Tensor hidden = model_->decode_paged(ids, tables, lengths, paged_);
  link.send(hidden);
  for (const Running& row : running_) conversations_[static_cast<size_t>(row.conversation)]->cached.push_back(row.token);
  std::vector<size_t> all(running_.size());
  for (size_t r = 0; r < all.size(); ++r) all[r] = r;
  draw(all, hidden.select(1, 0));
  ++stats_.decode_steps;
  stats_.largest_step = std::max(stats_.largest_step, rows);
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const Running& r) { return r.max_new_tokens == 0; }),
                 running_.end());
  return ended;
}

TurnBatcherStats TurnBatcher::stats() const {
  TurnBatcherStats s = stats_;
  s.pool_blocks = blocks_.num_blocks();
  s.peak_blocks = blocks_.peak_used_blocks();
  return s;
}

}  // namespace hybridflow
