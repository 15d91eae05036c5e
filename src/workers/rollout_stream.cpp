// rollout.stream_groups: a streaming call of the standalone rollout (workers/rollout_worker.h). One
// generate_sequences call per step leaves the pool's slots idle while the batch's longest responses finish;
// here the next step's prompts, once the controller has sent their request (queued behind this one) and
// published them, take those slots. The call returns when its own groups have ended. What the next step's
// samples drew so far is kept and continued by that step's call, as a partial rollout continues after a
// checkpoint: the prefix is prefilled again with the weights then held, and every token records the version
// that drew it. A step's samples therefore begin no earlier than its request was sent (the controller sends
// step t only once the pool holds weights of version >= t - staleness), and the call checks that bound again.
#include <algorithm>

#include "hybridflow/core/error.h"
#include "hybridflow/core/process_memory.h"
#include "hybridflow/model/batch_invariant.h"
#include "hybridflow/workers/lora_scopes.h"
#include "hybridflow/workers/rl_batch.h"
#include "hybridflow/workers/rollout_generation.h"
#include "hybridflow/workers/rollout_worker.h"

namespace hybridflow {

namespace {

// The first `rows` rows of a generation, their prompts cut to the last `prompt_width` columns (the prompts
// are left-padded to the longest of the call, streamed ones included).
GenerationOutput leading_rows(const GenerationOutput& out, int64_t rows, int64_t prompt_width) {
  GenerationOutput mine = out;
  const int64_t width = out.prompts.size(1);
  mine.prompts = out.prompts.narrow(0, 0, rows).narrow(1, width - prompt_width, prompt_width);
  mine.prompt_mask = out.prompt_mask.narrow(0, 0, rows).narrow(1, width - prompt_width, prompt_width);
  mine.responses = out.responses.narrow(0, 0, rows);
  mine.response_mask = out.response_mask.narrow(0, 0, rows);
  mine.log_probs = out.log_probs.narrow(0, 0, rows);
  if (out.token_versions.defined()) mine.token_versions = out.token_versions.narrow(0, 0, rows);
  if (out.finished.defined()) mine.finished = out.finished.narrow(0, 0, rows);
  return mine;
}

// The state of `prompts` prompts of n samples each whose first `admitted` began at row `first` of `out`
// (the rest not begun), as a continued generation takes it (GenerationConfig::resume).
PartialSequences carried_state(const GenerationOutput& out, int64_t first, int64_t prompts, int64_t admitted,
                               int64_t n) {
  const auto mask = out.response_mask.to(torch::kCPU);
  const auto responses = out.responses.to(torch::kCPU);
  const auto log_probs = out.log_probs.to(torch::kCPU);
  const auto versions = out.token_versions.to(torch::kCPU);
  const auto finished = out.finished.to(torch::kCPU);
  PartialSequences state;
  for (int64_t q = 0; q < prompts * n; ++q) {
    std::vector<int64_t> tokens, drawn_by;
    std::vector<float> lp;
    bool ended = false;
    if (q < admitted * n) {
      const int64_t row = first + q;
      const int64_t length = mask[row].sum().item<int64_t>();
      for (int64_t t = 0; t < length; ++t) {
        tokens.push_back(responses[row][t].item<int64_t>());
        lp.push_back(log_probs[row][t].item<float>());
        drawn_by.push_back(versions[row][t].item<int64_t>());
      }
      ended = finished[row].item<bool>();
    }
    state.tokens.push_back(std::move(tokens));
    state.log_probs.push_back(std::move(lp));
    state.versions.push_back(std::move(drawn_by));
    state.finished.push_back(ended);
  }
  return state;
}

}  // namespace

DataProto RolloutWorker::generate_streaming(const DataProto& in, GenerationConfig g) {
  HF_CHECK(weight_sync_, "generate_sequences: a streaming rollout (rollout.stream_groups) reads the next step's "
           "prompts from the weight-sync store; call join_weight_sync first");
  const nlohmann::json& meta = in.meta();
  const auto step = meta.at("stream_step").get<int64_t>();
  const auto staleness = meta.value("stream_staleness", int64_t{0});
  const bool has_next = meta.value("stream_has_next", false);
  const std::vector<std::vector<int64_t>> own = prompt_token_lists(in);
  const auto own_count = static_cast<int64_t>(own.size());
  int64_t own_longest = 0;
  for (const auto& p : own) own_longest = std::max<int64_t>(own_longest, static_cast<int64_t>(p.size()));

  // This step's samples that the call before started.
  PartialSequences saved;
  if (carried_ && carried_->step == step && carried_->prompts == own) {
    saved = std::move(carried_->state);
    g.resume = &saved;
  }
  carried_.reset();

  g.max_prompt_length = std::max(own_longest, meta.value("stream_max_prompt_length", int64_t{0}));
  g.refresh_weights = [this] { return policy_version_; };  // one version per call; the tokens record it
  // The next step's prompts, read from the store each round until published and startable.
  std::vector<std::vector<int64_t>> next;
  uint64_t next_seed = 0;
  bool next_known = !has_next;  // found, or nothing to look for
  int64_t admitted = 0;
  g.next_prompts = [&](int64_t room, bool) {
    std::vector<StreamedPrompt> more;
    if (!next_known && policy_version_ >= step + 1 - staleness) {
      const std::string published = weight_sync_->streamed_prompts(step + 1);
      if (!published.empty()) {
        next_known = true;
        const auto j = nlohmann::json::parse(published);
        auto prompts = j.at("prompts").get<std::vector<std::vector<int64_t>>>();
        const bool fits = std::all_of(prompts.begin(), prompts.end(), [&](const auto& p) {
          return !p.empty() && static_cast<int64_t>(p.size()) <= g.max_prompt_length;
        });
        if (fits) {
          DataProto seeded;
          seeded.meta()["seed"] = j.at("seed");
          next_seed = rollout_generation_config(rollout_spec_, model_spec_, model_->config(), seeded, coord().micro_dp,
                                                device())
                          .seed;
          next = std::move(prompts);
        }
      }
    }
    for (; room > 0 && admitted < static_cast<int64_t>(next.size()); --room, ++admitted)
      more.push_back({next[static_cast<size_t>(admitted)], next_seed, admitted * g.n});
    return more;
  };
  int64_t own_ended = 0;
  g.on_group_finished = [&](FinishedGroup&& group) { own_ended += group.prompt < own_count ? 1 : 0; };
  g.stop_requested = [&] { return own_ended == own_count; };

  GenerationOutput out;
  {
    BatchInvariantGuard batch_invariant(rollout_spec_.batch_invariant);
    MergedLoraScope merged(model_, rollout_spec_.lora_merge);
    out = generate(model_, own, g, nullptr);
  }
  if (rollout_spec_.free_cache_engine) release_cached_device_memory();
  const int64_t own_rows = own_count * g.n;
  HF_CHECK(own_ended == own_count, "generate_sequences: a streaming call returned with ", own_count - own_ended,
           " of its ", own_count, " groups unfinished");
  const GenerationOutput mine = leading_rows(out, own_rows, own_longest);
  DataProto result = rollout_result(mine, g, in);
  set_versions(result, mine);
  // Every sample began within the bound: at a version no older than step - staleness.
  const int64_t oldest = result.tensor("policy_version").min().item<int64_t>();
  HF_CHECK(oldest >= step - staleness, "generate_sequences: a streamed sample of step ", step, " began at policy version ",
           oldest, ", more than rollout.staleness = ", staleness, " behind");
  int64_t started_before = 0;  // own groups the call before had begun
  for (int64_t i = 0; i < own_count && !saved.tokens.empty(); ++i)
    for (int64_t j = 0; j < g.n; ++j)
      if (!saved.tokens[static_cast<size_t>(i * g.n + j)].empty()) {
        ++started_before;
        break;
      }
  result.meta()["streamed_groups"] = started_before;
  if (admitted > 0)
    carried_ = CarriedStep{step + 1, next, carried_state(out, own_rows, static_cast<int64_t>(next.size()), admitted, g.n)};
  return result;
}

}  // namespace hybridflow
