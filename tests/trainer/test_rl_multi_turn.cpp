// GRPO with multi-turn, tool-using rollouts over real worker processes: a tiny model over the calculator
// example's character tokenizer and chat template, taught in-test to call the calculator, trains one step on
// a dataset that mixes tool rows (agent_name top-level, and inside extra_info as verl's scripts put it) with
// a single-turn row. Checked: the command tool runs and its result reaches the conversation, only the
// sampled ids are in the loss mask, the actor trains on exactly the ids (and log-probs) the rollout
// sampled, the scorer judges the final answer and sees the whole conversation, and the agent metrics and
// samples.jsonl show the turns. RLOO, REINFORCE++ and PPO (GAE) train on the same trajectories with no weight
// on tool tokens, and the python + MCP example config runs a step with its own tools.
#include <gtest/gtest.h>

#include <filesystem>
#include <cstdlib>
#include <fstream>
#include <map>
#include <cmath>
#include <regex>

#include "hybridflow/core/jsonl.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/text/chat_template.h"
#include "hybridflow/text/tokenizer_config.h"
#include "hybridflow/trainer/rl_program.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rl_workers.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_rl_config.h"

using namespace hybridflow;

static const bool kRanAsWorker = (register_rl_workers(), run_worker_if_requested());

namespace {

using Json = nlohmann::ordered_json;
using hybridflow::testing::error_of;
using hybridflow::testing::tiny_rl_overrides;

const std::string kExample = HF_SOURCE_DIR "/examples/calculator_tool";

std::string call_text(const std::string& expression) {
  return "<tool_call>{\"name\":\"calculator\",\"arguments\":{\"expression\":\"" + expression + "\"}}</tool_call>";
}

// A 2-layer model over the example's tokenizer, fitted for two seconds to whole tool conversations (call,
// result, answer), so that it samples their calls: saved as a model directory.
std::string tool_calling_model(const std::string& dir, const std::vector<Json>& conversations) {
  const Tokenizer tokenizer = Tokenizer::load(kExample + "/tokenizer/tokenizer.json");
  const auto config = text::TokenizerConfig::load(kExample + "/tokenizer/tokenizer_config.json");
  ModelConfig c = preset_model_config("tiny", tokenizer.vocab_size());
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.eos_token_id = tokenizer.eos_id();
  c.pad_token_id = tokenizer.pad_id();
  c.bos_token_id = tokenizer.bos_id();
  torch::manual_seed(0);
  CausalLM model(c);
  std::vector<std::vector<int64_t>> rows;
  size_t width = 0;
  for (const Json& messages : conversations) {
    rows.push_back(tokenizer.encode(text::apply_chat_template(config, messages, false)));
    width = std::max(width, rows.back().size());
  }
  auto ids = torch::full({static_cast<int64_t>(rows.size()), static_cast<int64_t>(width)}, tokenizer.pad_id(), torch::kLong);
  auto mask = torch::zeros_like(ids);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t t = 0; t < rows[i].size(); ++t) {
      ids[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = rows[i][t];
      mask[static_cast<int64_t>(i)][static_cast<int64_t>(t)] = 1;
    }
  torch::optim::Adam opt(model->parameters(), torch::optim::AdamOptions(1e-2));
  for (int step = 0; step < 300; ++step) {
    const auto logits = model->forward(ids, mask).logits.slice(1, 0, -1);
    const auto target = ids.slice(1, 1).masked_fill(mask.slice(1, 1) == 0, -100);
    const auto loss = torch::nn::functional::cross_entropy(
        logits.reshape({-1, logits.size(-1)}), target.reshape({-1}),
        torch::nn::functional::CrossEntropyFuncOptions().ignore_index(-100));
    opt.zero_grad();
    loss.backward();
    opt.step();
  }
  save_pretrained(dir, model, tokenizer);
  return dir;
}

// The calculator's whole conversation for each question.
std::vector<Json> calculator_conversations(const std::vector<std::pair<std::string, std::string>>& qa) {
  std::vector<Json> conversations;
  for (const auto& [expression, answer] : qa)
    conversations.push_back(Json::array({{{"role", "user"}, {"content", "What is " + expression + "?"}},
                                         {{"role", "assistant"}, {"content", call_text(expression)}},
                                         {{"role", "tool"}, {"content", answer}},
                                         {{"role", "assistant"}, {"content", answer}}}));
  return conversations;
}

// A command scorer that appends every request line it reads to `log` and scores 1 for the right answer.
std::string logging_scorer(const std::string& log) {
  return "reward.shell=/usr/bin/python3 -c \"import sys, json\nfor l in sys.stdin:\n  open('" + log +
         "','a').write(l)\n  r = json.loads(l)\n  print(1.0 if r['response'] == r['ground_truth'] else 0.0, "
         "flush=True)\"";
}

std::vector<std::string> multi_turn_overrides(const std::string& dir, const std::string& model_dir,
                                              const std::vector<std::string>& extra = {}) {
  std::vector<std::string> o = {"model.path=" + model_dir,
                                "data.train_file=" + dir + "/train.jsonl",
                                "data.test_file=" + dir + "/train.jsonl",
                                "data.shuffle=false",
                                "data.train_batch_size=3",
                                "data.max_prompt_length=64",
                                "actor_rollout_ref.rollout.response_length=160",
                                "actor_rollout_ref.rollout.temperature=1.0",
                                "actor_rollout_ref.actor.ppo_mini_batch_size=3",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=6",
                                "actor_rollout_ref.rollout.multi_turn.enable=true",
                                "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + kExample + "/tools.yaml",
                                "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=3",
                                "trainer.run_dir=" + dir + "/run",
                                "trainer.log_samples_freq=1",
                                "trainer.log_samples_count=6",
                                "trainer.logger=[jsonl]"};
  o.insert(o.end(), extra.begin(), extra.end());
  return o;
}

// dir/train.jsonl's rows with a system message of `content` before each prompt, written to dir/name.
std::string with_system_message(const std::string& dir, const std::string& name, const std::string& content) {
  const std::string path = dir + "/" + name;
  std::ofstream out(path);
  for (const auto& row : read_jsonl(dir + "/train.jsonl")) {
    Json r = Json::parse(row.dump());
    r["prompt"].insert(r["prompt"].begin(), Json{{"role", "system"}, {"content", content}});
    out << r.dump() << "\n";
  }
  return path;
}

class RlMultiTurn : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new hybridflow::testing::TempDir();
    model_dir_ = tool_calling_model(dir_->file("model"), calculator_conversations({{"3*4", "12"}, {"5*6", "30"}, {"7*8", "56"}}));
    // Row 0: agent_name top-level; row 1: inside extra_info with tools_kwargs, as verl's scripts write
    // them; row 2: single-turn (no agent_name), in the same dataset.
    std::ofstream out(dir_->file("train.jsonl"));
    auto row = [](const std::string& q, const std::string& a) {
      return Json{{"data_source", "calculator"},
                  {"prompt", Json::array({{{"role", "user"}, {"content", "What is " + q + "?"}}})},
                  {"reward_model", {{"style", "rule"}, {"ground_truth", a}}}};
    };
    Json r0 = row("3*4", "12");
    r0["agent_name"] = "tool_agent";
    Json r1 = row("5*6", "30");
    r1["extra_info"] = {{"index", 1}, {"agent_name", "tool_agent"},
                        {"tools_kwargs", {{"calculator", {{"create_kwargs", {{"ground_truth", "30"}}}}}}}};
    Json r2 = row("7*8", "56");
    out << r0.dump() << "\n" << r1.dump() << "\n" << r2.dump() << "\n";
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  static hybridflow::testing::TempDir* dir_;
  static std::string model_dir_;
};
hybridflow::testing::TempDir* RlMultiTurn::dir_ = nullptr;
std::string RlMultiTurn::model_dir_;

TEST_F(RlMultiTurn, AGrpoStepTrainsOnTheSampledTokensOfToolConversations) {
  const std::string dir = dir_->path();
  const std::string log = dir + "/requests.jsonl";
  nlohmann::json record;
  {
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, {"reward.type=command", logging_scorer(log)}))));
    record = trainer.step();
  }
  SCOPED_TRACE(record.dump());
  // The tool rows called the calculator (the fitted model does) and saw its results; the single-turn row
  // ran one turn and no tool.
  ASSERT_TRUE(record.contains("agent/tool_calls/calculator"));
  EXPECT_GE(record["agent/tool_calls/calculator"].get<double>(), 3.0);
  EXPECT_GT(record["agent/turns_per_episode"].get<double>(), 1.0);
  EXPECT_EQ(record["agent/tool_timeouts"].get<double>(), 0.0);
  EXPECT_GT(record["agent/tool_seconds"].get<double>(), 0.0);
  EXPECT_GT(record["agent/appended_tokens_per_episode"].get<double>(), 0.0);
  EXPECT_TRUE(record.contains("agent/truncated_by_turns"));
  EXPECT_TRUE(record.contains("agent/truncated_by_length"));
  // The engine's counters reach the step's metrics too: every episode's first context went through a prefill.
  ASSERT_TRUE(record.contains("agent/prefill_tokens"));
  EXPECT_GT(record["agent/prefill_tokens"].get<double>(), 0.0);
  // The actor's log-probs of the ids it trains on equal the rollout's log-probs of the ids it sampled, at
  // every position of the loss mask: the trained tokens are the sampled ones (a re-encoded or shifted id
  // would differ by far more than float rounding).
  EXPECT_LT(std::abs(record["rollout_corr/log_ppl_diff"].get<double>()), 1e-4);
  EXPECT_LT(std::abs(record["rollout_corr/k3_kl"].get<double>()), 1e-6);
  EXPECT_TRUE(record.contains("actor/pg_loss"));

  // samples.jsonl: whole conversations with their roles; the loss mask counts exactly the sampled ids.
  const auto samples = read_jsonl(dir + "/run/samples.jsonl");
  ASSERT_EQ(samples.size(), 6u);
  int tool_samples = 0, computed = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const auto& s = samples[i];
    SCOPED_TRACE(s.dump());
    ASSERT_TRUE(s.contains("messages"));
    EXPECT_EQ(s["messages"][0]["role"], "user");
    EXPECT_EQ(s["response_length"], s["sampled_tokens"]);
    int tools = 0;
    for (const auto& m : s["messages"]) tools += m["role"] == "tool";
    if (i >= 4) {  // the single-turn row: one turn, no tool, nothing appended
      EXPECT_EQ(s["turns"], 1);
      EXPECT_EQ(tools, 0);
      EXPECT_EQ(s["appended_tokens"], 0);
      continue;
    }
    if (tools == 0) continue;
    ++tool_samples;
    EXPECT_GT(s["appended_tokens"].get<int64_t>(), 0);
    EXPECT_GE(s["turns"].get<int64_t>(), 2);
    // Each tool message answers the call before it: the product the command computed for the expression the
    // model wrote, or an error naming what was wrong with the call.
    const auto& messages = s["messages"];
    for (size_t k = 1; k < messages.size(); ++k) {
      if (messages[k]["role"] != "tool") continue;
      const std::string content = messages[k]["content"].get<std::string>();
      const auto& call = messages[k - 1];
      if (call["role"] != "assistant") continue;  // a second result of one turn
      if (!call.contains("tool_calls")) {  // a call that did not parse
        EXPECT_EQ(content.rfind("Error: ", 0), 0u) << content;
        continue;
      }
      if (call["tool_calls"].size() != 1) continue;
      const auto& arguments = call["tool_calls"][0]["function"]["arguments"];
      const std::string expression =
          arguments.contains("expression") && arguments["expression"].is_string() ? arguments["expression"].get<std::string>() : "";
      const size_t times = expression.find('*');
      if (!std::regex_match(expression, std::regex("[0-9]{1,9}\\*[0-9]{1,9}"))) {  // refused before or by the tool
        EXPECT_EQ(content.rfind("Error: ", 0), 0u) << expression << " -> " << content;
        continue;
      }
      const long long product = std::stoll(expression.substr(0, times)) * std::stoll(expression.substr(times + 1));
      EXPECT_EQ(content, std::to_string(product)) << expression;
      EXPECT_NE(s["response"].get<std::string>().find("tool\n" + content), std::string::npos);
      ++computed;
    }
  }
  EXPECT_GE(tool_samples, 3);
  EXPECT_GE(computed, 3);

  // The scorer judged each final answer and received the whole conversation.
  const auto seen = read_jsonl(log);
  ASSERT_EQ(seen.size(), 6u);
  for (const auto& r : seen) {
    SCOPED_TRACE(r.dump());
    ASSERT_TRUE(r.contains("messages"));
    const auto& last = r["messages"].back();
    EXPECT_EQ(last["role"], "assistant");
    EXPECT_EQ(r["response"], last["content"]);
  }
}

// A standalone rollout pool runs the same episodes as the actor's own processes: same seed, same weights
// (synced before the step), so the same conversations, scores and loss.
TEST_F(RlMultiTurn, AStandaloneRolloutPoolRunsTheSameEpisodesAsTheColocatedActor) {
  const std::string dir = dir_->path();
  auto one_step = [&](const std::string& placement) {
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, {"trainer.placement=" + placement,
                                                                              "trainer.run_dir=" + dir + "/" + placement}))));
    return trainer.step();
  };
  const nlohmann::json colocated = one_step("colocate");
  const nlohmann::json standalone = one_step("standalone");
  SCOPED_TRACE(colocated.dump() + "\n" + standalone.dump());
  EXPECT_GE(standalone["agent/tool_calls/calculator"].get<double>(), 3.0);
  for (const char* key : {"agent/turns_per_episode", "agent/tool_calls", "agent/malformed_calls",
                          "agent/sampled_tokens_per_episode", "agent/appended_tokens_per_episode", "score/mean"})
    EXPECT_EQ(colocated[key], standalone[key]) << key;
  EXPECT_NEAR(colocated["actor/pg_loss"].get<double>(), standalone["actor/pg_loss"].get<double>(), 1e-6);
  EXPECT_LT(std::abs(standalone["rollout_corr/k3_kl"].get<double>()), 1e-6);
}

// Prefix caching (the default): rows whose prompts begin with the same system message (here 3 rows of the
// training file's questions, each with the same instructions first) start on the blocks of the first one's
// prefill of it. The same episodes, scores and loss as with it off, and the positions it found are exactly the
// positions no longer prefilled.
TEST_F(RlMultiTurn, PrefixCachingRunsTheSameEpisodesWithFewerPositionsPrefilled) {
  const std::string dir = dir_->path();
  const std::string data = with_system_message(dir, "with_system.jsonl", "Call the calculator for every product.");
  auto one_step = [&](bool on) {
    const std::string name = on ? "prefix_on" : "prefix_off";
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(
                                          dir, model_dir_,
                                          {"actor_rollout_ref.rollout.enable_prefix_caching=" + std::string(on ? "true" : "false"),
                                           "data.train_file=" + data, "data.max_prompt_length=96",
                                           "trainer.run_dir=" + dir + "/" + name}))));
    return trainer.step();
  };
  const nlohmann::json on = one_step(true), off = one_step(false);
  SCOPED_TRACE(on.dump() + "\n" + off.dump());
  EXPECT_EQ(off["agent/prefix_cached_tokens"].get<double>(), 0.0);
  const double found = on["agent/prefix_cached_tokens"].get<double>();
  EXPECT_GE(found, 2 * 32.0);  // the two later rows each found at least the system message's first 2 blocks
  EXPECT_EQ(off["agent/prefill_tokens"].get<double>() - on["agent/prefill_tokens"].get<double>(), found);
  EXPECT_LT(on["agent/peak_kv_blocks"].get<double>(), off["agent/peak_kv_blocks"].get<double>());
  for (const char* key : {"agent/turns_per_episode", "agent/tool_calls", "agent/malformed_calls",
                          "agent/sampled_tokens_per_episode", "agent/appended_tokens_per_episode", "score/mean"})
    EXPECT_EQ(on[key], off[key]) << key;
  EXPECT_NEAR(on["actor/pg_loss"].get<double>(), off["actor/pg_loss"].get<double>(), 1e-5);
}

// Single-turn rollouts (multi_turn off) cache prefixes too: the same rows with the system message first run the
// same samples, scores and loss with prefix caching on and off, and the rollout reports the positions found.
TEST_F(RlMultiTurn, SingleTurnRolloutsStartOnTheSystemMessagesBlocksToo) {
  const std::string dir = dir_->path();
  const std::string data = with_system_message(dir, "single_turn_system.jsonl",
                                                "Answer with the product's digits and nothing else, please.");
  auto one_step = [&](bool on) {
    const std::string name = on ? "single_on" : "single_off";
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(
                                          dir, model_dir_,
                                          {"actor_rollout_ref.rollout.multi_turn.enable=false",
                                           "actor_rollout_ref.rollout.response_length=24",
                                           "actor_rollout_ref.rollout.enable_prefix_caching=" + std::string(on ? "true" : "false"),
                                           "data.train_file=" + data, "data.max_prompt_length=128",
                                           "trainer.run_dir=" + dir + "/" + name}))));
    return trainer.step();
  };
  const nlohmann::json on = one_step(true), off = one_step(false);
  SCOPED_TRACE(on.dump() + "\n" + off.dump());
  EXPECT_EQ(off["rollout/prefix_cached_tokens"].get<double>(), 0.0);
  // The two later rows each start on at least the system message's first 2 blocks of 16.
  EXPECT_GE(on["rollout/prefix_cached_tokens"].get<double>(), 2 * 32.0);
  EXPECT_EQ(on["score/mean"], off["score/mean"]);
  EXPECT_EQ(on["response_length/mean"], off["response_length/mean"]);
  EXPECT_NEAR(on["actor/pg_loss"].get<double>(), off["actor/pg_loss"].get<double>(), 1e-5);
}

// Rollout tensor and pipeline parallelism: the two ranks of one replica run the episodes of one process (rank 0
// or stage 0 runs them and their tool calls, the other repeats its schedule): the same conversations, scores and
// losses, colocated (the actor split in two, or in two stages that generate as they train) and on a standalone
// rollout pool of one two-rank replica.
TEST_F(RlMultiTurn, RolloutTensorAndPipelineParallelismRunTheEpisodesOfOneProcess) {
  const std::string dir = dir_->path();
  auto one_step = [&](const std::string& name, const std::vector<std::string>& layout) {
    std::vector<std::string> o = layout;
    o.push_back("trainer.run_dir=" + dir + "/" + name);
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, o))));
    return trainer.step();
  };
  const nlohmann::json one = one_step("tp1", {});
  const nlohmann::json colocated = one_step("tp2", {"actor_rollout_ref.num_processes=2",
                                                     "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2"});
  const nlohmann::json standalone =
      one_step("tp2_standalone", {"trainer.placement=standalone", "actor_rollout_ref.rollout.num_processes=2",
                                  "actor_rollout_ref.rollout.tensor_model_parallel_size=2"});
  const nlohmann::json staged = one_step("pp2", {"actor_rollout_ref.num_processes=2",
                                                 "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                                 "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"});
  for (const nlohmann::json* two : {&colocated, &standalone, &staged}) {
    SCOPED_TRACE(one.dump() + "\n" + two->dump());
    EXPECT_GE((*two)["agent/tool_calls/calculator"].get<double>(), 3.0);
    for (const char* key : {"agent/turns_per_episode", "agent/tool_calls", "agent/malformed_calls",
                            "agent/sampled_tokens_per_episode", "agent/appended_tokens_per_episode",
                            "agent/stop/answered", "response_length/mean", "score/mean"})
      EXPECT_EQ(one[key], (*two)[key]) << key;
    for (const char* key : {"actor/pg_loss", "actor/entropy"})
      EXPECT_NEAR(one[key].get<double>(), (*two)[key].get<double>(), 1e-5) << key;
    // The actor scores the trained ids as the split rollout sampled them.
    EXPECT_LT(std::abs((*two)["rollout_corr/k3_kl"].get<double>()), 1e-6);
  }
}

// Generation stages reached through the 3D-HybridEngine: a 2-stage x 2-way tensor-parallel actor switches to two
// replicas of two unsplit stages (each gathering its own layers) and runs the episodes of a 2-stage actor that
// generates as it trains (two replicas of the same stages, so the same draws): the same conversations, tool
// calls, scores and losses.
TEST_F(RlMultiTurn, GenerationStagesThroughTheHybridEngineRunTheEpisodesOfTheTrainingStages) {
  const std::string dir = dir_->path();
  auto one_step = [&](const std::string& name, const std::vector<std::string>& layout) {
    std::vector<std::string> o = {"actor_rollout_ref.num_processes=4",
                                  "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                  "actor_rollout_ref.rollout.pipeline_model_parallel_size=2",
                                  "data.train_batch_size=2",
                                  "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                                  "trainer.run_dir=" + dir + "/" + name};
    o.insert(o.end(), layout.begin(), layout.end());
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, o))));
    return trainer.step();
  };
  const nlohmann::json as_trained = one_step("pp2_dp2", {});
  const nlohmann::json switched = one_step("pp2_tp2", {"actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                                       "actor_rollout_ref.rollout.tensor_model_parallel_size=1"});
  SCOPED_TRACE(as_trained.dump() + "\n" + switched.dump());
  EXPECT_FALSE(as_trained.contains("reshard/model_bytes")) << "generating in the training layout needs no switch";
  EXPECT_TRUE(switched.contains("reshard/model_bytes")) << "the tensor-parallel actor switches to generation stages";
  EXPECT_GE(switched["agent/tool_calls/calculator"].get<double>(), 1.0);
  for (const char* key : {"agent/turns_per_episode", "agent/tool_calls", "agent/malformed_calls",
                          "agent/sampled_tokens_per_episode", "agent/appended_tokens_per_episode",
                          "response_length/mean", "score/mean"})
    EXPECT_EQ(as_trained[key], switched[key]) << key;
  for (const char* key : {"actor/pg_loss", "actor/entropy"})
    EXPECT_NEAR(as_trained[key].get<double>(), switched[key].get<double>(), 1e-5) << key;
  EXPECT_LT(std::abs(switched["rollout_corr/k3_kl"].get<double>()), 1e-6);
}

// What a step trained on, kept by trajectory_capturing_program.
struct TrainedTrajectories {
  at::Tensor responses, response_mask, response_attention, advantages, values;
  std::vector<nlohmann::json> episodes;
};
TrainedTrajectories& trained_trajectories() {
  static TrainedTrajectories kept;
  return kept;
}

// The built-in estimator program's stages (programs/policy_gradient.cpp) with the batch kept after its
// advantages are computed, so a test sees the masks, values and advantages the updates receive.
nlohmann::json trajectory_capturing_program(RLStep& step) {
  auto& [actor, ref, critic, reward, cost, cost_critic] = step.roles();
  RolloutBatch batch = actor.generate_sequences(step.next_prompts());
  Pending scores = reward.compute_reward(batch);
  Pending old_log_prob = actor.compute_log_prob(batch);
  Pending ref_log_prob = ref ? ref->compute_log_prob(batch) : Pending();
  Pending values = critic ? critic->compute_values(batch) : Pending();
  join(scores, old_log_prob, ref_log_prob, values);
  step.compute_advantage(batch, step.adv_estimator());
  const DataProto& data = batch.data();
  TrainedTrajectories& kept = trained_trajectories();
  kept.responses = data.tensor("responses").clone();
  kept.response_mask = data.tensor("response_mask").clone();
  const auto& attention = data.tensor("attention_mask");
  kept.response_attention = attention.slice(1, attention.size(1) - kept.responses.size(1)).clone();
  kept.advantages = data.tensor("advantages").clone();
  kept.values = data.has_tensor("values") ? data.tensor("values").clone() : at::Tensor();
  kept.episodes = data.field("agent_episode");
  Pending critic_updated = critic ? critic->update_critic(batch) : Pending();
  Pending actor_updated = actor.update_actor(batch);
  join(critic_updated, actor_updated);
  return step.finish(batch);
}

// RLOO, REINFORCE++ and PPO (a critic, GAE across the masked spans) train on whole trajectories: in each, the
// tokens of every tool result sit outside the loss mask and carry no advantage, the mask counts exactly the
// sampled ids, and the step's losses are finite; PPO's values are finite over the whole trajectory.
TEST_F(RlMultiTurn, RlooReinforcePlusPlusAndPpoTrainOnWholeTrajectories) {
  register_rl_program("capture_trajectories", trajectory_capturing_program);
  const std::string dir = dir_->path();
  const Tokenizer tokenizer = Tokenizer::load(kExample + "/tokenizer/tokenizer.json");
  for (const char* name : {"rloo", "reinforce_plus_plus", "gae"}) {
    const std::string estimator = name;
    SCOPED_TRACE(estimator);
    nlohmann::json record;
    {
      RLTrainer trainer(load_rl_config(
          "", tiny_rl_overrides(estimator, multi_turn_overrides(dir, model_dir_, {"algorithm.program=capture_trajectories",
                                                                                   "critic.ppo_mini_batch_size=3",
                                                                                   "critic.ppo_micro_batch_size_per_gpu=6",
                                                                                   "trainer.run_dir=" + dir + "/" + estimator}))));
      record = trainer.step();
    }
    SCOPED_TRACE(record.dump());
    EXPECT_GE(record["agent/tool_calls/calculator"].get<double>(), 3.0);
    EXPECT_TRUE(std::isfinite(record["actor/pg_loss"].get<double>()));
    const TrainedTrajectories& kept = trained_trajectories();
    ASSERT_EQ(kept.responses.size(0), 6);
    ASSERT_EQ(kept.episodes.size(), 6u);
    const auto mask = kept.response_mask.to(torch::kLong);
    const auto attention = kept.response_attention.to(torch::kLong);
    const auto advantages = kept.advantages.to(torch::kDouble);
    EXPECT_TRUE(torch::isfinite(advantages).all().item<bool>());
    if (estimator == "gae") {
      ASSERT_TRUE(kept.values.defined());
      EXPECT_TRUE(torch::isfinite(kept.values.to(torch::kDouble).masked_select(attention != 0)).all().item<bool>());
      EXPECT_TRUE(std::isfinite(record["critic/vf_loss"].get<double>()));
    }
    int tool_spans = 0;
    for (int64_t row = 0; row < kept.responses.size(0); ++row) {
      const auto& episode = kept.episodes[static_cast<size_t>(row)];
      SCOPED_TRACE(episode.dump());
      // The mask counts the sampled ids; the other real ids of the response are the appended ones.
      EXPECT_EQ(mask[row].sum().item<int64_t>(), episode["sampled_tokens"].get<int64_t>());
      EXPECT_EQ(((attention[row] != 0) & (mask[row] == 0)).sum().item<int64_t>(), episode["appended_tokens"].get<int64_t>());
      // No advantage outside the mask: padding, template ids and tool results add nothing to the loss.
      EXPECT_EQ(advantages[row].masked_select(mask[row] == 0).abs().sum().item<double>(), 0.0);
      // Each tool result, found by decoding the ids one by one, lies wholly outside the mask.
      std::string text;
      std::vector<int64_t> token_of_char;
      for (int64_t t = 0; t < kept.responses.size(1) && attention[row][t].item<int64_t>() != 0; ++t) {
        const std::string piece = tokenizer.decode({kept.responses[row][t].item<int64_t>()}, false);
        text += piece;
        token_of_char.insert(token_of_char.end(), piece.size(), t);
      }
      size_t from = 0;
      for (const auto& message : episode["messages"]) {
        if (message["role"] != "tool") continue;
        const std::string span = "<|im_start|>tool\n" + message["content"].get<std::string>() + "<|im_end|>";
        const size_t at = text.find(span, from);
        ASSERT_NE(at, std::string::npos) << span << " in " << text;
        for (size_t k = at; k < at + span.size(); ++k) {
          EXPECT_EQ(mask[row][token_of_char[k]].item<int64_t>(), 0) << "tool result token at " << token_of_char[k];
          EXPECT_EQ(advantages[row][token_of_char[k]].item<double>(), 0.0);
        }
        from = at + span.size();
        ++tool_spans;
      }
    }
    EXPECT_GE(tool_spans, 3);
  }
}

// The python + MCP example as shipped (examples/grpo_python_mcp_tools.yaml, its tool config, MCP server and
// data writer), shrunk to one GRPO step of 2 questions x 2 episodes on a model fitted in the test to its
// demonstrations: the sandboxed python tool runs the model's code, the MCP server started from the venv
// answers the stock lookup, and the results reach the conversations.
TEST_F(RlMultiTurn, ThePythonAndMcpExampleRunsAGrpoStep) {
  if (std::system("command -v bwrap >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "bwrap (bubblewrap) is not installed: the example's python tool runs code under it "
                    "(apt-get install bubblewrap)";
  const std::string source = HF_SOURCE_DIR;
  const std::string data = dir_->file("python_mcp");
  ASSERT_EQ(std::system(("python3 " + source + "/examples/python_mcp_tools/make_data.py " + data + " >/dev/null").c_str()), 0);
  // One demonstration of each tool (the SFT rows whose prompt ends with the tool's result), and their RL rows.
  struct Demonstrated {
    std::string tool;
    Json arguments;
    std::string result;
  };
  std::vector<Json> conversations;
  std::map<std::string, Demonstrated> expected;  // by question
  for (const auto& demo : read_jsonl(data + "/sft_tools.jsonl")) {
    if (demo["prompt"].size() != 3) continue;
    const std::string call = demo["prompt"][1]["content"].get<std::string>();  // <tool_call>{...}</tool_call>
    const Json parsed = Json::parse(call.substr(11, call.size() - 11 - 12));
    bool have = false;
    for (const auto& [q, e] : expected) have = have || e.tool == parsed["name"];
    if (have) continue;
    Json conversation = demo["prompt"];
    conversation.push_back({{"role", "assistant"}, {"content", demo["response"]}});
    conversations.push_back(conversation);
    expected[demo["prompt"][0]["content"].get<std::string>()] = {parsed["name"].get<std::string>(), parsed["arguments"],
                                                                 demo["prompt"][2]["content"].get<std::string>()};
  }
  ASSERT_EQ(expected.size(), 2u);
  {
    std::ofstream out(data + "/rows.jsonl");
    for (const auto& row : read_jsonl(data + "/train.jsonl"))
      if (expected.count(row["prompt"][0]["content"].get<std::string>()) != 0) out << row.dump() << "\n";
  }
  const std::string model = tool_calling_model(data + "/model", conversations);
  nlohmann::json record;
  {
    RLTrainer trainer(load_rl_config(
        source + "/examples/grpo_python_mcp_tools.yaml",
        {"model.path=" + model, "data.train_file=" + data + "/rows.jsonl", "data.test_file=" + data + "/rows.jsonl",
         "data.test_size=2", "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2",
         "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
         "actor_rollout_ref.rollout.multi_turn.tool_config_path=" + source + "/examples/python_mcp_tools/tools.yaml",
         "trainer.test_freq=0", "trainer.log_samples_freq=1", "trainer.log_samples_count=4", "trainer.logger=[jsonl]",
         "trainer.run_dir=" + data + "/run"}));
    record = trainer.step();
  }
  SCOPED_TRACE(record.dump());
  ASSERT_TRUE(record.contains("agent/tool_calls/python"));
  ASSERT_TRUE(record.contains("agent/tool_calls/stock"));
  EXPECT_GE(record["agent/tool_calls/python"].get<double>(), 1.0);
  EXPECT_GE(record["agent/tool_calls/stock"].get<double>(), 1.0);
  EXPECT_TRUE(std::isfinite(record["actor/pg_loss"].get<double>()));
  // A call written as demonstrated gets the demonstrated result: the product printed in the sandbox, the
  // count from the server's table.
  std::map<std::string, int> answered;
  for (const auto& s : read_jsonl(data + "/run/samples.jsonl")) {
    SCOPED_TRACE(s.dump());
    const auto& messages = s["messages"];
    const Demonstrated& demonstrated = expected.at(messages[0]["content"].get<std::string>());
    for (size_t k = 2; k < messages.size(); ++k) {
      const auto& call = messages[k - 1];
      if (messages[k]["role"] != "tool" || call["role"] != "assistant" || !call.contains("tool_calls")) continue;
      if (call["tool_calls"].size() != 1) continue;
      const auto& function = call["tool_calls"][0]["function"];
      if (function["name"] != demonstrated.tool || Json(function["arguments"]) != demonstrated.arguments) continue;
      EXPECT_EQ(messages[k]["content"], demonstrated.result);
      ++answered[demonstrated.tool];
    }
  }
  EXPECT_GE(answered["python"], 1);
  EXPECT_GE(answered["stock"], 1);
}

TEST_F(RlMultiTurn, RefusesWhatItCannotRun) {
  const std::string dir = dir_->path();
  // No chat template: a preset's character tokenizer.
  std::string msg = error_of([&] {
    RLTrainer trainer(load_rl_config("", tiny_rl_overrides("grpo", {"actor_rollout_ref.rollout.multi_turn.enable=true"})));
  });
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.multi_turn.enable"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.path is empty"), std::string::npos) << msg;
  // Generation in pipeline stages and tensor-parallel ranks at once.
  msg = error_of([&] {
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, {"actor_rollout_ref.num_processes=4",
                                                                              "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2",
                                                                              "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                                                                              "actor_rollout_ref.rollout.pipeline_model_parallel_size=2"}))));
  });
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.pipeline_model_parallel_size = 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.tensor_model_parallel_size = 2"), std::string::npos) << msg;
  // Bad keys name themselves.
  msg = error_of([&] {
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, {"actor_rollout_ref.rollout.multi_turn.format=mistral"}))));
  });
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.multi_turn.format"), std::string::npos) << msg;
  msg = error_of([&] {
    RLTrainer trainer(load_rl_config(
        "", tiny_rl_overrides("grpo", multi_turn_overrides(dir, model_dir_, {"actor_rollout_ref.rollout.multi_turn.max_assistant_turns=0"}))));
  });
  EXPECT_NE(msg.find("actor_rollout_ref.rollout.multi_turn.max_assistant_turns must be >= 1"), std::string::npos) << msg;
}

}  // namespace
