// The controller's share of a step's data: prompt batches, and rule-based rewards and costs of
// decoded responses.
#include <random>

#include "rl_trainer_state.h"

namespace hybridflow {

std::vector<int64_t> seeded_permutation(int64_t size, uint64_t seed) {
  // Fisher-Yates with the raw generator (not std::shuffle, whose steps differ between standard libraries).
  std::vector<int64_t> order(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) order[static_cast<size_t>(i)] = i;
  std::mt19937_64 rng(seed);
  for (int64_t i = size - 1; i > 0; --i)
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(rng() % static_cast<uint64_t>(i + 1))]);
  return order;
}

const std::vector<int64_t>& RLTrainer::State::epoch_order(int64_t epoch, int64_t size) const {
  // A function of seed and epoch alone, so a resumed run draws the same.
  if (order_epoch != epoch || static_cast<int64_t>(order.size()) != size) {
    order = seeded_permutation(size, run.data.seed.value_or(run.trainer.seed) * 1000003ULL + static_cast<uint64_t>(epoch));
    order_epoch = epoch;
  }
  return order;
}

DataProto RLTrainer::State::next_prompts(int64_t count, const std::vector<EncodedPrompt>& from, int64_t* pos,
                                         bool shuffle) const {
  HF_CHECK(!from.empty(), "RL trainer: no examples to draw prompts from");
  std::vector<std::vector<int64_t>> ids;
  std::vector<nlohmann::json> prompts, answers, data_sources, extra_infos;
  std::vector<nlohmann::json> messages, agent_names, tools_kwargs, interaction_kwargs;  // multi-turn only
  auto unordered = [](const nlohmann::ordered_json& v) { return nlohmann::json::parse(v.dump()); };
  const auto size = static_cast<int64_t>(from.size());
  for (int64_t i = 0; i < count; ++i) {
    const int64_t at = (*pos)++;
    const int64_t index = shuffle ? epoch_order(at / size, size)[static_cast<size_t>(at % size)] : at % size;
    const EncodedPrompt& p = from[static_cast<size_t>(index)];
    ids.push_back(p.ids);
    prompts.emplace_back(p.text);
    answers.emplace_back(p.answer);
    data_sources.emplace_back(p.data_source);
    extra_infos.emplace_back(p.extra_info);
    if (!multi_turn()) continue;
    messages.push_back(unordered(p.messages));
    agent_names.emplace_back(p.agent_name);
    tools_kwargs.push_back(unordered(p.tools_kwargs));
    interaction_kwargs.push_back(unordered(p.interaction_kwargs));
  }
  // Per-sample fields ride with the batch (and are repeated with each prompt's rollout.n samples), so the
  // scorers see every response next to its own row's data.
  DataProto batch = make_prompt_batch(ids, tokenizer.pad_id());
  batch.set_field("prompt", std::move(prompts));
  batch.set_field("answer", std::move(answers));
  batch.set_field("data_source", std::move(data_sources));
  batch.set_field("extra_info", std::move(extra_infos));
  if (multi_turn()) {  // what an agent episode starts from (workers/agent_rollout.h's rows)
    batch.set_field("messages", std::move(messages));
    batch.set_field("agent_name", std::move(agent_names));
    batch.set_field("tools_kwargs", std::move(tools_kwargs));
    batch.set_field("interaction_kwargs", std::move(interaction_kwargs));
  }
  return batch;
}

std::vector<RewardRequest> RLTrainer::State::reward_requests(const DataProto& gen,
                                                             const std::vector<std::string>& texts) const {
  const auto& prompts = gen.field("prompt");
  const auto& answers = gen.field("answer");
  const auto& data_sources = gen.field("data_source");
  const auto& extra_infos = gen.field("extra_info");
  std::vector<RewardRequest> requests;
  requests.reserve(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    RewardRequest r;
    r.prompt = prompts[i].get<std::string>();
    r.response = texts[i];
    r.answer = answers[i].get<std::string>();
    r.data_source = data_sources[i].get<std::string>();
    r.extra_info = extra_infos[i];
    // A multi-turn row's scorer also sees the whole conversation, tool results and user turns included.
    if (gen.has_field("agent_episode")) r.extra["messages"] = gen.field("agent_episode")[i].at("messages");
    requests.push_back(std::move(r));
  }
  return requests;
}

std::vector<std::string> RLTrainer::State::decode_responses(const DataProto& gen) const {
  const auto responses = gen.tensor("responses").contiguous();
  // The response's real ids are right-aligned after the left-padded prompt: the attention mask's response
  // part counts them all (the response mask counts only the sampled ones, which differ in a multi-turn row).
  const auto attention = gen.tensor("attention_mask");
  const auto lengths = attention.slice(1, attention.size(1) - responses.size(1)).sum(1).contiguous();
  std::vector<std::string> texts;
  for (int64_t i = 0; i < responses.size(0); ++i) {
    const auto row = responses[i].slice(0, 0, lengths[i].item<int64_t>());
    texts.push_back(tokenizer.decode(std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel())));
  }
  return texts;
}

std::vector<std::string> RLTrainer::State::scored_responses(const DataProto& gen) const {
  if (!gen.has_field("agent_episode")) return decode_responses(gen);
  const auto& episodes = gen.field("agent_episode");
  std::vector<std::string> texts;
  texts.reserve(episodes.size());
  for (const auto& episode : episodes) {
    // An episode ends right after a sampled turn, so its last message is the final assistant message.
    const auto& messages = episode.at("messages");
    const bool answered = !messages.empty() && messages.back().value("role", "") == "assistant";
    texts.push_back(answered ? messages.back().value("content", "") : std::string());
  }
  return texts;
}

std::vector<double> RLTrainer::State::rule_scores(const DataProto& gen) const {
  const auto texts = scored_responses(gen);
  const auto& prompts = gen.field("prompt");
  const auto& answers = gen.field("answer");
  if (run.scoring.reward_type == "none") return std::vector<double>(texts.size(), 0.0);
  if (reward_fn) return reward_fn->score(reward_requests(gen, texts));
  std::vector<double> scores;
  for (size_t i = 0; i < texts.size(); ++i)
    scores.push_back(task->score(texts[i], Example{prompts[i].get<std::string>(), answers[i].get<std::string>()}));
  return scores;
}

std::vector<double> RLTrainer::State::rule_costs(const DataProto& gen) const {
  const auto texts = scored_responses(gen);
  const std::string& type = run.scoring.cost_type;
  if (type == "none") return std::vector<double>(texts.size(), 0.0);
  if (cost_fn) return cost_fn->score(reward_requests(gen, texts));
  const auto& needles = run.scoring.cost_contains;
  std::vector<double> costs;
  for (const auto& text : texts)
    costs.push_back(std::any_of(needles.begin(), needles.end(),
                                [&](const std::string& w) { return text.find(w) != std::string::npos; }) ? 1.0 : 0.0);
  return costs;
}

}  // namespace hybridflow
