// What a step writes for watching the run beside its metrics (trainer/step_records.h): a few decoded
// rollout samples and the timeline of its calls. In the step, so that every algorithm program gets both.
#include <cmath>

#include "hybridflow/trainer/step_records.h"
#include "rl_stages.h"

namespace hybridflow {

void TrainerStages::log_samples(const RolloutBatchState& r, int64_t step) {
  if (!logs_samples_at(step, s_.run.trainer.log_samples_freq)) return;
  const DataProto& batch = r.data;
  const auto rows = sample_rows(batch.batch_size(), s_.run.trainer.log_samples_count);
  if (rows.empty()) return;
  const auto mask = batch.tensor("response_mask").to(torch::kDouble);
  std::vector<RolloutSample> samples;
  std::vector<nlohmann::json> records;
  for (int64_t i : rows) {
    RolloutSample s;
    if (batch.has_field("prompt")) {
      const auto& p = batch.field("prompt")[i];
      s.prompt = p.is_string() ? p.get<std::string>() : p.dump();
    }
    s.response = s_.decode_responses(batch.slice(i, i + 1)).at(0);
    if (batch.has_field("agent_episode")) s.episode = batch.field("agent_episode")[static_cast<size_t>(i)];
    const double tokens = mask[i].sum().item<double>();
    s.response_length = static_cast<int64_t>(tokens);
    s.score = r.scores.defined() ? r.scores[i].item<double>() : NAN;
    s.reward = batch.has_tensor("token_level_rewards") ? batch.tensor("token_level_rewards")[i].sum().item<double>()
                                                       : s.score;
    // 0 / 0 for an empty response: NaN, written as null.
    s.advantage = batch.has_tensor("advantages")
                      ? (batch.tensor("advantages")[i].to(torch::kDouble) * mask[i]).sum().item<double>() / tokens
                      : NAN;
    records.push_back(sample_record(step, s));
    samples.push_back(std::move(s));
  }
  s_.metrics->add_samples(step, records, rollout_samples_markdown(samples));
}

void TrainerStages::log_timeline(int64_t step) {
  s_.metrics->add_timeline(timeline_records(step, s_.timeline->take(), step_start_, step_start_unix_s_));
}

}  // namespace hybridflow
