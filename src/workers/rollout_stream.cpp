// rollout.stream_groups: a streaming call of the standalone rollout (workers/rollout_worker.h). One
// generate_sequences call per step leaves the pool's slots idle while the batch's longest responses finish,
// and the trainer waits for them. Here a call runs every prompt the controller has sent and not yet seen come
// back (the request's "stream_pending", workers/stream_prompts.h), and the next step's prompts once the
// controller has published them and the weights held are within the staleness bound of that step, in the
// slots that free up; it returns as soon as train_batch_size groups have ended, whichever requests drew them,
// oldest first. The groups it did not return stay in the rollout process with what they drew, and the next
// call continues them as a partial rollout continues after a checkpoint: each prefix is prefilled again with
// the weights then held, and every token records the version that drew it. A carried group begun more than
// `staleness` versions before the step that would train it is started again.
#include <algorithm>
#include <map>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/process_memory.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/workers/lora_scopes.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rollout_generation.h"
#include "hybridflow/workers/rollout_worker.h"
#include "hybridflow/workers/stream_prompts.h"

namespace hybridflow {

namespace {

// Rows `rows` of a generation, their prompts cut to the last `prompt_width` columns (the prompts are
// left-padded to the longest of the call).
GenerationOutput stream_rows(const GenerationOutput& out, const std::vector<int64_t>& rows, int64_t prompt_width) {
  const auto index = torch::tensor(rows, torch::kLong).to(out.responses.device());
  const int64_t width = out.prompts.size(1);
  GenerationOutput mine = out;
  mine.prompts = out.prompts.index_select(0, index).narrow(1, width - prompt_width, prompt_width);
  mine.prompt_mask = out.prompt_mask.index_select(0, index).narrow(1, width - prompt_width, prompt_width);
  mine.responses = out.responses.index_select(0, index);
  mine.response_mask = out.response_mask.index_select(0, index);
  mine.log_probs = out.log_probs.index_select(0, index);
  if (out.token_versions.defined()) mine.token_versions = out.token_versions.index_select(0, index);
  if (out.finished.defined()) mine.finished = out.finished.index_select(0, index.cpu());
  return mine;
}

// What prompt p's n samples drew (rows p*n + j of `out`), as StreamedPrompt::saved takes it, and the version
// that began its oldest sample (-1 when none had drawn a token).
struct DrawnGroup {
  PartialSequences state;
  int64_t begin_version = -1;
};

DrawnGroup drawn_group(const GenerationOutput& out, int64_t p, int64_t n) {
  const auto rows = out.responses.narrow(0, p * n, n).to(torch::kCPU);
  const auto mask = out.response_mask.narrow(0, p * n, n).to(torch::kCPU);
  const auto log_probs = out.log_probs.narrow(0, p * n, n).to(torch::kCPU).contiguous();
  const auto versions = out.token_versions.narrow(0, p * n, n).to(torch::kCPU);
  const auto finished = out.finished.narrow(0, p * n, n);
  DrawnGroup group;
  for (int64_t j = 0; j < n; ++j) {
    const int64_t length = mask[j].sum().item<int64_t>();
    const auto r = rows[j].narrow(0, 0, length).contiguous();
    const auto v = versions[j].narrow(0, 0, length).contiguous();
    const float* lp = log_probs[j].data_ptr<float>();
    group.state.tokens.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + length);
    group.state.log_probs.emplace_back(lp, lp + length);
    group.state.versions.emplace_back(v.data_ptr<int64_t>(), v.data_ptr<int64_t>() + length);
    group.state.finished.push_back(finished[j].item<bool>());
    if (length > 0) {
      const int64_t began = v.data_ptr<int64_t>()[0];
      group.begin_version = group.begin_version < 0 ? began : std::min(group.begin_version, began);
    }
  }
  return group;
}

// The per-prompt fields of `prompts`, as a request's fields (a key a prompt lacks is null there).
DataProto fields_of(const std::vector<const StreamPrompt*>& prompts) {
  std::set<std::string> keys;
  for (const StreamPrompt* p : prompts)
    for (const auto& [key, value] : p->fields.items()) keys.insert(key);
  DataProto fields;
  for (const std::string& key : keys) {
    std::vector<nlohmann::json> values;
    for (const StreamPrompt* p : prompts) values.push_back(p->fields.value(key, nlohmann::json()));
    fields.set_field(key, std::move(values));
  }
  return fields;
}

}  // namespace

DataProto RolloutWorker::generate_streaming(const DataProto& in, GenerationConfig g) {
  HF_CHECK(weight_sync_, "generate_sequences: a streaming rollout (rollout.stream_groups) reads the next step's "
           "prompts from the weight-sync store; call join_weight_sync first");
  const nlohmann::json& meta = in.meta();
  const auto step = meta.at("stream_step").get<int64_t>();
  const auto staleness = meta.value("stream_staleness", int64_t{0});
  const bool has_next = meta.value("stream_has_next", false);
  const int64_t wanted = in.batch_size();  // the step's batch: as many groups as its request has prompts
  HF_CHECK(meta.contains("stream_pending"), "generate_sequences: the streaming request of step ", step,
           " lists no pending prompts (meta 'stream_pending')");
  std::vector<StreamPrompt> pending =
      stream_prompts_from_json(meta.at("stream_pending"), "generate_sequences: meta 'stream_pending'");

  // A request sent before this process's last reply reached the controller still lists what it returned.
  if (!pending.empty()) {
    int64_t oldest = pending.front().step;
    for (const StreamPrompt& p : pending) oldest = std::min(oldest, p.step);
    std::erase_if(returned_, [oldest](const auto& key) { return key.first < oldest; });
  }
  std::erase_if(pending, [this](const StreamPrompt& p) { return returned_.count(p.key()) > 0; });
  HF_CHECK(static_cast<int64_t>(pending.size()) >= wanted, "generate_sequences: the streaming request of step ", step,
           " lists ", pending.size(), " prompts not yet returned, fewer than the ", wanted, " groups it returns");
  std::set<std::pair<int64_t, int64_t>> listed;
  for (const StreamPrompt& p : pending) listed.insert(p.key());
  // What the controller no longer lists is not wanted; what began too long ago is started again.
  int64_t restarted = 0;
  for (auto it = carried_.begin(); it != carried_.end();) {
    const bool stale = it->second.begin_version < step - staleness;
    if (listed.count(it->first) == 0 || stale) {
      restarted += stale ? 1 : 0;
      it = carried_.erase(it);
    } else {
      ++it;
    }
  }

  int64_t longest = meta.value("stream_max_prompt_length", int64_t{0});
  for (const StreamPrompt& p : pending) longest = std::max<int64_t>(longest, static_cast<int64_t>(p.ids.size()));
  g.max_prompt_length = longest;
  g.refresh_weights = [this] { return policy_version_; };  // one version per call; the tokens record it
  std::map<std::string, uint64_t> seeds;  // a request's meta seed -> this rank's sampling seed
  const auto seed_of = [&](const nlohmann::json& raw) {
    auto [it, fresh] = seeds.try_emplace(raw.dump(), 0);
    if (fresh) {
      DataProto seeded;
      seeded.meta()["seed"] = raw;
      it->second =
          rollout_generation_config(rollout_spec_, model_spec_, model_->config(), seeded, coord().micro_dp, device()).seed;
    }
    return it->second;
  };

  // Admission order is the generation's prompt order: the pending prompts (oldest first), then the next
  // step's as slots free.
  std::vector<StreamPrompt> admitted;
  std::set<int64_t> continued;  // admitted prompts whose samples an earlier call began
  std::vector<StreamPrompt> next;
  size_t next_admitted = 0;
  bool pending_given = false, next_known = !has_next;
  g.next_prompts = [&](int64_t room, bool) {
    std::vector<StreamedPrompt> more;
    if (!pending_given) {
      pending_given = true;
      for (StreamPrompt& p : pending) {
        StreamedPrompt s{p.ids, seed_of(p.seed), p.index * g.n, {}};
        if (auto c = carried_.find(p.key()); c != carried_.end()) {
          s.saved = std::move(c->second.state);
          continued.insert(static_cast<int64_t>(admitted.size()));
        }
        more.push_back(std::move(s));
        admitted.push_back(std::move(p));
        --room;
      }
      carried_.clear();
    }
    if (!next_known && policy_version_ >= step + 1 - staleness) {
      const std::string published = weight_sync_->streamed_prompts(step + 1);
      if (!published.empty()) {
        next_known = true;
        for (StreamPrompt& p : stream_prompts_from_json(nlohmann::json::parse(published).at("prompts"),
                                                        "generate_sequences: the published prompts of step " +
                                                            std::to_string(step + 1)))
          if (listed.count(p.key()) == 0 && returned_.count(p.key()) == 0 &&
              static_cast<int64_t>(p.ids.size()) <= g.max_prompt_length)
            next.push_back(std::move(p));
      }
    }
    for (; room > 0 && next_admitted < next.size(); --room, ++next_admitted) {
      more.push_back({next[next_admitted].ids, seed_of(next[next_admitted].seed), next[next_admitted].index * g.n, {}});
      admitted.push_back(std::move(next[next_admitted]));
    }
    return more;
  };
  std::vector<int64_t> ended;  // admitted prompts, in the order their groups ended
  g.on_group_finished = [&ended](FinishedGroup&& group) { ended.push_back(group.prompt); };
  g.stop_requested = [&] { return static_cast<int64_t>(ended.size()) >= wanted; };

  GenerationOutput out;
  {
    BatchInvariantGuard batch_invariant(rollout_spec_.batch_invariant);
    MergedLoraScope merged(model_, rollout_spec_.lora_merge);
    out = generate(model_, {}, g, nullptr);
  }
  if (rollout_spec_.free_cache_engine) release_cached_device_memory();
  HF_CHECK(static_cast<int64_t>(ended.size()) >= wanted, "generate_sequences: a streaming call ended with ",
           ended.size(), " of the ", wanted, " groups it returns");

  // The first `wanted` groups to end, oldest request first.
  std::vector<int64_t> chosen(ended.begin(), ended.begin() + wanted);
  std::sort(chosen.begin(), chosen.end(), [&admitted](int64_t a, int64_t b) {
    return admitted[static_cast<size_t>(a)].key() < admitted[static_cast<size_t>(b)].key();
  });
  std::vector<int64_t> rows;
  std::vector<const StreamPrompt*> chosen_prompts;
  int64_t width = 1, ahead = 0, began_before = 0;
  nlohmann::json returned = nlohmann::json::array();
  for (int64_t p : chosen) {
    const StreamPrompt& prompt = admitted[static_cast<size_t>(p)];
    for (int64_t j = 0; j < g.n; ++j) rows.push_back(p * g.n + j);
    chosen_prompts.push_back(&prompt);
    width = std::max<int64_t>(width, static_cast<int64_t>(prompt.ids.size()));
    ahead += prompt.step > step ? 1 : 0;
    began_before += continued.count(p) > 0 ? 1 : 0;
    returned.push_back({prompt.step, prompt.index});
    returned_.insert(prompt.key());
  }
  const GenerationOutput mine = stream_rows(out, rows, width);
  DataProto result = rollout_result(mine, g, fields_of(chosen_prompts));
  set_versions(result, mine);
  // Every sample began within the bound: at a version no older than step - staleness.
  const int64_t oldest = result.tensor("policy_version").min().item<int64_t>();
  HF_CHECK(oldest >= step - staleness, "generate_sequences: a streamed sample of step ", step, " began at policy version ",
           oldest, ", more than rollout.staleness = ", staleness, " behind");

  // The rest stay here with what they drew (a prompt not begun is simply listed again).
  const std::set<int64_t> chosen_set(chosen.begin(), chosen.end());
  for (int64_t p = 0; p < static_cast<int64_t>(admitted.size()); ++p) {
    if (chosen_set.count(p) > 0) continue;
    DrawnGroup drawn = drawn_group(out, p, g.n);
    if (drawn.begin_version >= 0)
      carried_[admitted[static_cast<size_t>(p)].key()] = {std::move(drawn.state), drawn.begin_version};
  }
  result.meta()["stream_returned"] = returned;
  result.meta()["streamed_groups"] = began_before;
  result.meta()["stream_groups_ahead"] = ahead;
  result.meta()["stream_groups_carried"] = static_cast<int64_t>(carried_.size());
  result.meta()["stream_groups_restarted"] = restarted;
  return result;
}

}  // namespace hybridflow
