// Continuous batching of conversation turns with cached-prefix resume; see engine/turn_batcher.h.
#include "hybridflow/engine/turn_batcher.h"

#include <algorithm>

#include "engine/generation_steps.h"
#include "hybridflow/core/device_upload.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/decode_graph_obstacles.h"
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
  int64_t prefill = -1;       // the step's prefill of the prompt, until it has run and set last_hidden
  int64_t pending = 0;        // members holding the prompt that have not started from it
};

// A turn's context queued for this step's batched prefill: its blocks hold positions [0, from) already.
struct TurnBatcher::PendingPrefill {
  int64_t conversation = 0;
  int64_t number = 0;  // its index in prefilled_
  int64_t from = 0;
  bool admitted = false;  // admitted on this context now: the blocks it fills whole go to the prefix cache
  std::vector<int64_t> context;
};

struct TurnBatcher::Running {
  int64_t conversation = 0;
  int64_t turn = 0;   // the conversation's turn number
  int64_t token = 0;  // the last token drawn: the next step's input
  int64_t max_new_tokens = 0;
  std::vector<int64_t> ids;
  std::vector<float> log_probs;
  int64_t first = -1;  // admitted this step with its first token still on the device: its FirstDraws index
};

// The first tokens of the turns a step admitted, drawn on the device, one row each ([1] tensors; no_mass
// undefined when greedy).
struct TurnBatcher::FirstDraws {
  std::vector<torch::Tensor> tokens, log_probs, no_mass;
};

namespace {

// Tokens for last-position hidden states [rows, hidden], drawn on the device with nothing read back. With
// pipeline stages the last one draws and every stage takes its tokens (the others' hidden is their output);
// only the last checks its rows' sampling mass, the others carry a flag of all false.
generation::TokenDraw draw_turn_tokens(CausalLM& model, Communicator* stages, const GenerationConfig& cfg,
                                       const torch::Tensor& hidden, const torch::Tensor& uniforms) {
  generation::StageLink link(model, stages);
  generation::TokenDraw draw;
  if (link.samples()) draw = generation::choose_tokens_on_device(model, hidden, cfg, uniforms);
  link.share(draw.tokens, draw.log_probs, hidden.size(0));
  if (!cfg.greedy && !draw.no_mass.defined())
    draw.no_mass = torch::zeros({hidden.size(0)}, torch::TensorOptions().dtype(torch::kBool).device(hidden.device()));
  // Under tensor parallelism every rank draws from the same gathered logits; rank 0's choice is taken
  // anyway, so that the ranks' caches and turn ends cannot drift apart by a rounding.
  if (model->tensor_parallel().enabled()) {
    draw.tokens = draw.tokens.to(torch::kInt64).contiguous();
    model->tensor_parallel().comm()->broadcast(draw.tokens, 0);
  }
  return draw;
}

// `part` [n] followed by zeros up to `rows` entries (rows that did not draw at a chunk's step).
torch::Tensor padded_to_rows(const torch::Tensor& part, int64_t rows) {
  if (!part.defined() || part.size(0) == rows) return part;
  return torch::cat({part, torch::zeros({rows - part.size(0)}, part.options())});
}

}  // namespace

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
  HF_CHECK(cfg.readback_interval >= 1, "TurnBatcher: readback_interval must be >= 1 decode step, got ",
           cfg.readback_interval);
  check_required_decode_graphs(model, cfg, "multi-turn rollouts on continuous batching (the turn batcher decodes "
                                          "eagerly)");
  for (int64_t c = 0; c < conversations; ++c) conversations_.push_back(std::make_unique<Conversation>());
  group_size_ = group_size;
  groups_.resize(static_cast<size_t>((conversations + group_size - 1) / group_size));
  HF_CHECK(cfg.max_num_batched_tokens >= 1, "TurnBatcher: max_num_batched_tokens (positions one prefill forward may ",
           "hold) must be >= 1, got ", cfg.max_num_batched_tokens);
  if (cfg.enable_prefix_caching) prefix_cache_.emplace(cfg.kv_block_size);
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

// Room for `members` sequences sharing a first context of `positions` ids, the first blocks of them in `prefix`
// already, each of up to max_positions: true when the free, unreserved blocks cover their worst case, after
// growing a pool that grows on demand.
bool TurnBatcher::room_for(int64_t positions, int64_t members, int64_t max_positions,
                           const std::vector<int64_t>& prefix) {
  if (blocks_.can_admit(positions, members, max_positions, prefix)) return true;
  if (fixed_pool_ > 0) return false;
  grow_pool(blocks_.worst_case_blocks(positions, members, max_positions, prefix) -
            (blocks_.free_blocks() - blocks_.reserved_blocks()));
  return true;
}

// The held blocks other conversations' prefills wrote for the context's first whole blocks (none when prefix
// caching is off). When a first context waiting in the step's batch begins with more of them, the batch runs
// first, so that its blocks are recorded and found.
std::vector<int64_t> TurnBatcher::cached_prefix(const std::vector<int64_t>& context) {
  if (!prefix_cache_) return {};
  std::vector<int64_t> found = prefix_cache_->find(context, blocks_);
  for (const PendingPrefill& p : pending_)
    if (p.admitted && prefix_cache_->blocks_in_common(context, p.context) > static_cast<int64_t>(found.size())) {
      run_prefills();
      return prefix_cache_->find(context, blocks_);
    }
  return found;
}

// Starts conversation `id`'s queued turn: from its group's shared prompt, by a delta prefill when its context
// extends what its blocks hold, else (its first turn, or a context that does not extend the cache) admission
// and a prefill of the whole context. Returns where the hidden state of its last context position comes from,
// or nothing when its blocks do not fit yet.
std::optional<TurnBatcher::FirstHidden> TurnBatcher::start(int64_t id) {
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
  if (extends) return FirstHidden{{}, queue_prefill(id, cached)};
  if (c.sequence >= 0) {
    blocks_.release(c.sequence);
    c.sequence = -1;
    c.cached.clear();
    ++stats_.full_prefills;
  }
  const auto length = static_cast<int64_t>(c.context.size());
  const std::vector<int64_t> prefix = cached_prefix(c.context);
  const auto prefix_blocks = static_cast<int64_t>(prefix.size());
  if (!room_for(length, 1, c.max_positions, prefix)) {
    HF_CHECK(held_blocks() > 0, "multi-turn generation: a conversation of up to ", c.max_positions,
             " positions needs ", blocks_.worst_case_blocks(length, 1, c.max_positions), " KV blocks of ",
             blocks_.block_size(), " positions; the pool has ", blocks_.num_blocks(),
             " (raise kv_cache_blocks, gpu_memory_utilization or the memory budget)");
    return std::nullopt;  // waits for a conversation to end
  }
  c.sequence = blocks_.admit(length, 1, c.max_positions, prefix).front();
  // The admission counted the context's positions as held; the prefill writes those past the cached prefix.
  return FirstHidden{{}, queue_prefill(id, prefix_blocks * blocks_.block_size(), true)};
}

// The first of group members to start: admits the group's live members on its first context (each takes a
// reference to the prompt's blocks), prefills it once and keeps its last hidden state for the others.
std::optional<TurnBatcher::FirstHidden> TurnBatcher::admit_group(int64_t id) {
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
  const std::vector<int64_t> prefix = cached_prefix(c.context);
  const auto prefix_blocks = static_cast<int64_t>(prefix.size());
  if (count == 1 || !room_for(length, count, c.max_positions, prefix)) {
    if (count > 1 && held_blocks() > 0) return std::nullopt;  // waits for blocks to free
    // One member left, or a group larger than the whole pool: its members are admitted one by one.
    g.admitted = true;
    return start(id);
  }
  const std::vector<int64_t> sequences = blocks_.admit(length, count, c.max_positions, prefix);
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
  const int64_t prefill = queue_prefill(id, prefix_blocks * blocks_.block_size(), true);
  if (g.pending > 0) g.prefill = prefill;
  return FirstHidden{{}, prefill};
}

// A member whose first context is its group's prompt: its first token comes from the shared prefill's last
// hidden state, the one its own prefill of the same ids would compute.
TurnBatcher::FirstHidden TurnBatcher::start_shared(int64_t id) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  const Group& g = groups_[static_cast<size_t>(id / group_size_)];
  const FirstHidden hidden{g.last_hidden, g.prefill};
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

// Queues conversation `id`'s context for the step's batched prefill, from position `from` on, attending to the
// cached positions before it, and starts its turn. admitted: the sequence was admitted on this context just
// now (its positions are held, those before `from` in blocks of the prefix cache), so every block the context
// fills is a prefill's and is recorded; otherwise a delta past the cached ids, whose positions are taken
// here. Runs the queued prefills first when this one would take the batch past max_num_batched_tokens.
// Returns the prefill's number.
int64_t TurnBatcher::queue_prefill(int64_t id, int64_t from, bool admitted) {
  Conversation& c = *conversations_[static_cast<size_t>(id)];
  const auto total = static_cast<int64_t>(c.context.size());
  while (blocks_.length(c.sequence) < total) {
    const BlockManager::Append where = blocks_.append(c.sequence);
    if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
  }
  int64_t past = from, width = total - from;
  for (const PendingPrefill& p : pending_) {
    past = std::max(past, p.from);
    width = std::max(width, static_cast<int64_t>(p.context.size()) - p.from);
  }
  if (!pending_.empty() && static_cast<int64_t>(pending_.size() + 1) * (past + width) > cfg_.max_num_batched_tokens)
    run_prefills();
  const auto number = static_cast<int64_t>(prefilled_.size());
  prefilled_.emplace_back();
  stats_.prefill_tokens += total - from;
  stats_.reused_tokens += from;
  if (admitted) stats_.prefix_cached_tokens += from;
  c.cached = c.context;
  pending_.push_back(PendingPrefill{id, number, from, admitted, std::move(c.context)});
  begin_turn(id);
  return number;
}

// One forward for the queued prefills: row r's cached positions [0, from_r) gathered from its blocks and
// left-padded to the longest (masked), its new ids at slab positions past.. and sequence positions from_r..,
// right-padded. Their keys and values go to their blocks, their last hidden states to prefilled_.
void TurnBatcher::run_prefills() {
  if (pending_.empty()) return;
  const auto rows = static_cast<int64_t>(pending_.size());
  std::vector<const std::vector<int64_t>*> contexts;
  std::vector<std::vector<int64_t>> tables;
  std::vector<int64_t> lengths, starts;
  for (const PendingPrefill& p : pending_) {
    contexts.push_back(&p.context);
    tables.push_back(blocks_.table(conversations_[static_cast<size_t>(p.conversation)]->sequence));
    lengths.push_back(static_cast<int64_t>(p.context.size()));
    starts.push_back(p.from);
  }
  const generation::PrefillRows in = generation::prefill_rows(contexts, starts, cfg_.pad_token_id);
  const auto device = model_->parameters().front().device();
  KVCache cache = paged_.gather(tables, starts, in.past + in.width);
  generation::StageLink link(model_, stages_);
  link.receive(rows, in.width);
  const torch::Tensor hidden =
      model_->hidden_states(upload(in.ids, device), upload(in.mask, device), upload(in.positions, device), &cache);
  link.send(hidden);
  ++stats_.prefill_forwards;
  if (paged_.keys.empty())
    for (const auto& k : cache.keys) {
      const std::vector<int64_t> sizes = {blocks_.num_blocks(), k.size(1), blocks_.block_size(), k.size(3)};
      paged_.keys.push_back(generation::zero_slab(sizes, k.options()));
      paged_.values.push_back(generation::zero_slab(sizes, k.options()));
    }
  paged_.write_prefill(cache, tables, lengths, starts, in.shifts);
  for (int64_t r = 0; r < rows; ++r) {
    const PendingPrefill& p = pending_[static_cast<size_t>(r)];
    if (p.admitted && prefix_cache_)
      prefix_cache_->record(p.context, tables[static_cast<size_t>(r)], lengths[static_cast<size_t>(r)] / blocks_.block_size(),
                            blocks_);
    prefilled_[static_cast<size_t>(p.number)] = hidden.narrow(0, r, 1).select(1, in.last[static_cast<size_t>(r)]);
  }
  pending_.clear();
  for (Group& g : groups_) {
    if (g.prefill < 0 || !prefilled_[static_cast<size_t>(g.prefill)].defined()) continue;
    if (g.pending > 0) g.last_hidden = prefilled_[static_cast<size_t>(g.prefill)];
    g.prefill = -1;
  }
}

torch::Tensor TurnBatcher::first_hidden(const FirstHidden& first) const {
  return first.prefill >= 0 ? prefilled_[static_cast<size_t>(first.prefill)] : first.hidden;
}

std::vector<BatchedTurn> TurnBatcher::step() {
  torch::NoGradGuard no_grad;
  std::vector<BatchedTurn> ended;
  const auto count = static_cast<int64_t>(conversations_.size());
  const auto device = model_->parameters().front().device();
  // Queued turns, in the order they came, as far as the running limit and the blocks allow; prefilled
  // together (run_prefills), their first tokens drawn on the device in one pass from their last positions.
  FirstDraws firsts;
  std::deque<int64_t> waiting;
  std::vector<std::pair<size_t, FirstHidden>> started;  // the running row of each turn started, its hidden state
  for (int64_t id : queued_) {
    const bool room = cfg_.max_num_seqs <= 0 || static_cast<int64_t>(running_.size()) < cfg_.max_num_seqs;
    std::optional<FirstHidden> first = room ? start(id) : std::nullopt;
    if (!first) {
      waiting.push_back(id);
      continue;
    }
    started.emplace_back(running_.size() - 1, std::move(*first));
  }
  run_prefills();
  if (!started.empty()) {
    std::vector<torch::Tensor> lasts;
    std::vector<int64_t> sequences;
    for (const auto& [row, first] : started) {
      lasts.push_back(first_hidden(first));
      sequences.push_back(running_[row].turn * count + running_[row].conversation);
    }
    const torch::Tensor uniforms =
        cfg_.greedy ? torch::Tensor()
                    : generation::sampling_uniforms(cfg_, sequences, std::vector<int64_t>(sequences.size(), 0), 1, device)
                          .squeeze(0);
    const generation::TokenDraw draw = draw_turn_tokens(model_, stages_, cfg_, torch::cat(lasts), uniforms);
    for (size_t k = 0; k < started.size(); ++k) {
      running_[started[k].first].first = static_cast<int64_t>(k);
      const auto at = static_cast<int64_t>(k);
      firsts.tokens.push_back(draw.tokens.narrow(0, at, 1));
      firsts.log_probs.push_back(draw.log_probs.narrow(0, at, 1));
      firsts.no_mass.push_back(draw.no_mass.defined() ? draw.no_mass.narrow(0, at, 1) : torch::Tensor());
    }
  }
  prefilled_.clear();
  queued_ = std::move(waiting);
  // Interval 1 reads the first tokens back before decoding: a turn that ends on its first token joins no step.
  if (cfg_.readback_interval == 1 && !firsts.tokens.empty()) run_chunk(0, firsts, ended);
  if (!running_.empty()) run_chunk(cfg_.readback_interval, firsts, ended);
  return ended;
}

// Up to max_steps decode steps for every running turn (0: none, only the admissions' first tokens), with the
// tokens kept on the device and read back once at the end; the turns that ended go to `ended`.
void TurnBatcher::run_chunk(int64_t max_steps, FirstDraws& firsts, std::vector<BatchedTurn>& ended) {
  const auto count = static_cast<int64_t>(conversations_.size());
  const auto device = model_->parameters().front().device();
  // A turn whose first token is its last (max_new_tokens 1) decodes nothing: such rows go last, and the
  // first `decoding` rows decode. The chunk ends where a decoding turn reaches its max_new_tokens.
  std::stable_partition(running_.begin(), running_.end(),
                        [](const Running& r) { return r.first < 0 || r.max_new_tokens > 1; });
  const auto rows = static_cast<int64_t>(running_.size());
  int64_t decoding = 0, steps = max_steps;
  std::vector<int64_t> known, sequences, drawn;
  std::vector<uint8_t> admitted;
  for (const Running& row : running_) {
    const int64_t so_far = static_cast<int64_t>(row.ids.size()) + (row.first >= 0 ? 1 : 0);
    known.push_back(row.first >= 0 ? 0 : row.token);
    admitted.push_back(row.first >= 0 ? 1 : 0);
    if (so_far >= row.max_new_tokens) continue;
    ++decoding;
    steps = std::min(steps, row.max_new_tokens - so_far);
    sequences.push_back(row.turn * count + row.conversation);
    drawn.push_back(so_far);
  }
  if (decoding == 0) steps = 0;
  const bool admitting = !firsts.tokens.empty();
  const int64_t offset = admitting ? 1 : 0;  // the ring's entry 0 holds the admissions' first tokens
  generation::TokenRing ring(rows, offset + steps, cfg_, device);
  // Each row's next input: its last token, known on the host or (admitted now) still on the device.
  torch::Tensor input = upload(torch::tensor(known, torch::kInt64), device);
  if (admitting) {
    const auto f64 = torch::TensorOptions().dtype(torch::kFloat64).device(device);
    const torch::Tensor no_lp = torch::zeros({1}, f64);
    const torch::Tensor no_flag = torch::zeros({1}, torch::TensorOptions().dtype(torch::kBool).device(device));
    std::vector<torch::Tensor> tokens, log_probs, no_mass;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t f = running_[static_cast<size_t>(r)].first;
      const auto at = static_cast<size_t>(f);
      tokens.push_back(f >= 0 ? firsts.tokens[at].to(torch::kInt64).view({1}) : input.narrow(0, r, 1));
      log_probs.push_back(f >= 0 ? firsts.log_probs[at].to(torch::kFloat64).view({1}) : no_lp);
      if (!cfg_.greedy) no_mass.push_back(f >= 0 ? firsts.no_mass[at].view({1}) : no_flag);
    }
    input = torch::cat(tokens);
    const torch::Tensor drawing = upload(torch::tensor(admitted, torch::kUInt8), device).to(torch::kBool);
    ring.record(0, input, torch::cat(log_probs), cfg_.greedy ? torch::Tensor() : torch::cat(no_mass), drawing);
  }

  const torch::Tensor uniforms =
      cfg_.greedy || steps == 0 ? torch::Tensor() : generation::sampling_uniforms(cfg_, sequences, drawn, steps, device);
  torch::Tensor drawing;  // rows past `decoding` draw nothing
  if (decoding < rows && steps > 0)
    drawing = torch::arange(rows, torch::TensorOptions().dtype(torch::kInt64).device(device)).lt(decoding);
  std::vector<int64_t> lengths;
  for (int64_t r = 0; r < decoding; ++r)
    lengths.push_back(static_cast<int64_t>(
        conversations_[static_cast<size_t>(running_[static_cast<size_t>(r)].conversation)]->cached.size()));
  for (int64_t k = 0; k < steps; ++k) {
    std::vector<std::vector<int64_t>> tables;
    for (int64_t r = 0; r < decoding; ++r) {
      const Conversation& c = *conversations_[static_cast<size_t>(running_[static_cast<size_t>(r)].conversation)];
      // Room for the input token's key and value; a shared block is copied before the step writes to it.
      const BlockManager::Append where = blocks_.append(c.sequence);
      if (where.copy_from >= 0) paged_.copy_block(where.copy_from, where.block);
      tables.push_back(blocks_.table(c.sequence));
    }
    generation::StageLink link(model_, stages_);
    link.receive(decoding, 1);
    const torch::Tensor hidden =
        model_->decode_paged(input.narrow(0, 0, decoding).view({decoding, 1}), tables, lengths, paged_);
    link.send(hidden);
    for (int64_t& length : lengths) ++length;  // the input token is in the cache now
    const generation::TokenDraw draw =
        draw_turn_tokens(model_, stages_, cfg_, hidden.select(1, 0), uniforms.defined() ? uniforms[k] : uniforms);
    input = padded_to_rows(draw.tokens, rows);
    ring.record(offset + k, input, padded_to_rows(draw.log_probs, rows), padded_to_rows(draw.no_mass, rows), drawing);
  }
  const generation::TokenRing::Chunk chunk = ring.read_back();
  ++stats_.host_syncs;
  if (steps > 0) {
    stats_.decode_steps += steps;
    stats_.largest_step = std::max(stats_.largest_step, decoding);
  }

  const auto tokens = chunk.tokens.accessor<int64_t, 2>();
  const auto log_probs = chunk.log_probs.accessor<float, 2>();
  const auto live = chunk.live.accessor<bool, 2>();
  const auto stopped = chunk.ended.accessor<bool, 1>();
  for (int64_t r = 0; r < rows; ++r) {
    Running& row = running_[static_cast<size_t>(r)];
    Conversation& c = *conversations_[static_cast<size_t>(row.conversation)];
    for (int64_t e = row.first >= 0 ? 0 : offset; e < offset + (r < decoding ? steps : 0) && live[e][r]; ++e) {
      if (e >= offset) c.cached.push_back(row.token);  // the decode step's input, in the cache now
      row.ids.push_back(tokens[e][r]);
      row.log_probs.push_back(log_probs[e][r]);
      row.token = tokens[e][r];
    }
    row.first = -1;
    // Steps past the turn's end wrote positions it gives back: its next turn's prefill writes them again.
    if (r < decoding && steps > 0) blocks_.truncate(c.sequence, static_cast<int64_t>(c.cached.size()));
    if (!stopped[r] && static_cast<int64_t>(row.ids.size()) < row.max_new_tokens) continue;
    c.running = false;
    ++stats_.turns;
    ended.push_back(BatchedTurn{row.conversation, std::move(row.ids), std::move(row.log_probs)});
    row.ids.clear();
    row.max_new_tokens = 0;  // marks the row as ended
  }
  running_.erase(std::remove_if(running_.begin(), running_.end(), [](const Running& r) { return r.max_new_tokens == 0; }),
                 running_.end());
  firsts = FirstDraws{};
}

TurnBatcherStats TurnBatcher::stats() const {
  TurnBatcherStats s = stats_;
  s.pool_blocks = blocks_.num_blocks();
  s.peak_blocks = blocks_.peak_used_blocks();
  return s;
}

}  // namespace hybridflow
