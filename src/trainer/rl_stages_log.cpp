// What a step writes for watching the run beside its metrics (trainer/step_records.h): a few decoded
// rollout samples, every row when trainer.rollout_data_dir is set, and the timeline of its calls. In the
// step, so that every algorithm program gets them.
#include <cmath>

#include "hybridflow/trainer/step_records.h"
#include "rl_stages.h"

namespace hybridflow {

namespace {

std::string text_of(const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); }

}  // namespace

RolloutSample rollout_sample(const DataProto& batch, const at::Tensor& scores, int64_t i, std::string response) {
  const auto row = static_cast<size_t>(i);
  RolloutSample s;
  if (batch.has_field("prompt")) s.prompt = text_of(batch.field("prompt")[row]);
  if (batch.has_field("answer")) s.answer = text_of(batch.field("answer")[row]);
  if (batch.has_field("data_source")) s.data_source = text_of(batch.field("data_source")[row]);
  s.response = std::move(response);
  if (batch.has_field("agent_episode")) s.episode = batch.field("agent_episode")[row];
  const auto mask = batch.tensor("response_mask")[i].to(torch::kDouble);
  const double tokens = mask.sum().item<double>();
  s.response_length = static_cast<int64_t>(tokens);
  s.score = scores.defined() ? scores[i].item<double>() : NAN;
  s.reward = batch.has_tensor("token_level_rewards") ? batch.tensor("token_level_rewards")[i].sum().item<double>()
                                                     : s.score;
  // 0 / 0 for an empty response: NaN, written as null.
  s.advantage = batch.has_tensor("advantages")
                    ? (batch.tensor("advantages")[i].to(torch::kDouble) * mask).sum().item<double>() / tokens
                    : NAN;
  return s;
}

void TrainerStages::log_samples(const RolloutBatchState& r, int64_t step) {
  if (!logs_samples_at(step, s_.run.trainer.log_samples_freq)) return;
  const DataProto& batch = r.data;
  const auto rows = sample_rows(batch.batch_size(), s_.run.trainer.log_samples_count);
  if (rows.empty()) return;
  std::vector<RolloutSample> samples;
  std::vector<nlohmann::json> records;
  for (int64_t i : rows) {
    samples.push_back(rollout_sample(batch, r.scores, i, s_.decode_responses(batch.slice(i, i + 1)).at(0)));
    records.push_back(sample_record(step, samples.back()));
  }
  s_.metrics->add_samples(step, records, rollout_samples_markdown(samples));
}

void TrainerStages::dump_rollout(const RolloutBatchState& r, int64_t step) {
  const std::string& dir = s_.run.trainer.rollout_data_dir;
  if (dir.empty()) return;
  auto responses = s_.decode_responses(r.data);
  std::vector<nlohmann::json> records;
  records.reserve(responses.size());
  for (size_t i = 0; i < responses.size(); ++i)
    records.push_back(
        generation_record(step, rollout_sample(r.data, r.scores, static_cast<int64_t>(i), std::move(responses[i])), true));
  write_generations(dir, step, records);
}

void TrainerStages::log_timeline(int64_t step) {
  s_.metrics->add_timeline(timeline_records(step, s_.timeline->take(), step_start_, step_start_unix_s_));
}

}  // namespace hybridflow
