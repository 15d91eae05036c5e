// Token-exact trajectories: a conversation built turn by turn (sampled ids as they are, tool results and
// user turns appended as template deltas) must be exactly transformers' ids of the whole conversation, on
// the real Llama 3 and Qwen3 tokenizers and templates.
#include "hybridflow/agent/trajectory.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/error_of.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"

namespace hybridflow::agent {
namespace {

using hybridflow::testing::error_of;

std::string tokenizer_dir(const std::string& model) { return hybridflow::testing::tokenizer_data_dir() + "/" + model; }

Json msg(const std::string& role, const std::string& content) { return Json{{"role", role}, {"content", content}}; }

const Json kTools = Json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
   "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                  "required": ["city"]}}},
  {"type": "function", "function": {"name": "add", "description": "a + b",
   "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                  "required": ["a", "b"]}}}])");

// An agentic conversation: `turns` assistant turns, the first turns-1 calling `calls` tools each (Qwen:
// tool_calls; Llama 3: the JSON call as content) answered by one tool message per call; an optional user
// follow-up after the first answer; reasoning on each assistant turn when `reasoning`.
Json conversation(bool qwen, int turns, int calls, bool follow_up, bool reasoning) {
  Json messages = Json::array({msg("system", "You can use tools."), msg("user", "Weather in Oslo and Lima, and 2+3?")});
  const char* cities[] = {"Oslo", "Lima", "Zürich"};
  for (int t = 0; t < turns; ++t) {
    bool last = t == turns - 1;
    Json reply = {{"role", "assistant"}};
    if (reasoning) reply["reasoning_content"] = "Turn " + std::to_string(t) + ": think about it.";
    if (last) {
      reply["content"] = "It is sunny; 2+3 = 5. ✓";
    } else if (qwen) {
      reply["content"] = t == 0 ? "Let me check." : "";
      reply["tool_calls"] = Json::array();
      for (int c = 0; c < calls; ++c) {
        Json args = c % 2 == 0 ? Json{{"city", cities[(t + c) % 3]}, {"days", c + 1}} : Json{{"a", 2}, {"b", t + c}};
        reply["tool_calls"].push_back(
            {{"type", "function"}, {"function", {{"name", c % 2 == 0 ? "get_weather" : "add"}, {"arguments", args}}}});
      }
    } else {
      reply["content"] = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"" + std::string(cities[t % 3]) + "\"}}";
    }
    messages.push_back(reply);
    if (last) break;
    for (int c = 0; c < (qwen ? calls : 1); ++c)
      messages.push_back(msg("tool", "{\"result\": \"" + std::to_string(t) + "." + std::to_string(c) + " ✓\"}"));
    if (follow_up && t == 0) {
      // The model answers, the user asks again.
      messages.push_back({{"role", "assistant"}, {"content", "Oslo: 4 °C."}});
      if (reasoning) messages.back()["reasoning_content"] = "Summarise.";
      messages.push_back(msg("user", "And tomorrow?"));
    }
  }
  return messages;
}

struct OracleIds {
  std::string text;
  std::vector<int32_t> ids;
};

// transformers' render and ids for each case (tests/agent/trajectory_oracle.py in the project venv).
std::vector<OracleIds> ask_transformers(const Json& cases) {
  hybridflow::testing::TempDir dir;
  {
    std::ofstream out(dir.file("request.json"), std::ios::binary);
    out << Json{{"cases", cases}}.dump();
  }
  auto run = hybridflow::testing::run_shell(
      "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + hybridflow::testing::shell_quote(hybridflow::testing::python_for_tests()) +
      " " + hybridflow::testing::shell_quote(HF_SOURCE_DIR "/tests/agent/trajectory_oracle.py") + " " +
      hybridflow::testing::shell_quote(dir.file("request.json")) + " " + hybridflow::testing::shell_quote(dir.file("answer.json")));
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::vector<OracleIds> out;
  if (run.exit_code != 0) return out;
  std::ifstream in(dir.file("answer.json"), std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const Json answer = Json::parse(ss.str());  // kept alive: the loop below reads into it
  for (const auto& c : answer["cases"]) out.push_back({c["text"], c["ids"].get<std::vector<int32_t>>()});
  return out;
}

struct Model {
  std::string name;
  text::Tokenizer tokenizer;
  text::TokenizerConfig config;
  int32_t end_of_turn;
};

Model load_model(const std::string& name) {
  auto tokenizer = text::Tokenizer::from_file(tokenizer_dir(name) + "/tokenizer.json");
  auto config = text::TokenizerConfig::load(tokenizer_dir(name) + "/tokenizer_config.json");
  int32_t eot = *tokenizer.token_to_id(name == "qwen3" ? "<|im_end|>" : "<|eot_id|>");
  return {name, std::move(tokenizer), std::move(config), eot};
}

// Replays `messages` through a TrajectoryBuilder the way a rollout would: the "sampled" ids of each
// assistant turn are cut from transformers' ids of the whole conversation (up to and including its
// end-of-turn token), everything else is appended by the builder. Returns the builder's trajectory.
// `sampled_positions` (if given) receives the positions in full_ids of the ids handed over as sampled.
Trajectory replay(const Model& model, const Json& messages, const Json& tools, const std::vector<int32_t>& full_ids,
                  std::vector<size_t>* sampled_positions = nullptr) {
  TrajectoryBuilder builder(model.tokenizer, model.config, tools);
  size_t first_assistant = 0;
  while (messages[first_assistant]["role"] != "assistant") ++first_assistant;
  Json prompt = Json::array();
  for (size_t i = 0; i < first_assistant; ++i) prompt.push_back(messages[i]);
  builder.start(prompt);
  size_t cursor = builder.trajectory().prompt_ids.size();
  for (size_t i = first_assistant; i < messages.size();) {
    size_t end = cursor;
    while (end < full_ids.size() && full_ids[end] != model.end_of_turn) ++end;
    EXPECT_LT(end, full_ids.size()) << "no end-of-turn token for message " << i;
    std::vector<int32_t> sampled(full_ids.begin() + static_cast<std::ptrdiff_t>(cursor),
                                 full_ids.begin() + static_cast<std::ptrdiff_t>(std::min(end + 1, full_ids.size())));
    builder.append_sampled(sampled, messages[i]);
    for (size_t p = cursor; p < cursor + sampled.size() && sampled_positions != nullptr; ++p) sampled_positions->push_back(p);
    ++i;
    Json appended = Json::array();
    while (i < messages.size() && messages[i]["role"] != "assistant") appended.push_back(messages[i++]);
    if (!appended.empty()) builder.append_messages(appended);
    cursor = builder.trajectory().prompt_ids.size() + builder.trajectory().response_ids.size();
  }
  return builder.trajectory();
}

std::vector<int32_t> all_ids(const Trajectory& t) {
  std::vector<int32_t> ids = t.prompt_ids;
  ids.insert(ids.end(), t.response_ids.begin(), t.response_ids.end());
  return ids;
}

class TokenExactTrajectory : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const std::string name : {"llama3", "qwen3"})
      ASSERT_TRUE(std::filesystem::exists(tokenizer_dir(name) + "/tokenizer.json"))
          << "no test tokenizer " << name << " in " << hybridflow::testing::tokenizer_data_searched();
  }
};

TEST_F(TokenExactTrajectory, EqualsTransformersIdsOfTheWholeConversation) {
  struct Case {
    std::string model;
    Json messages;
  };
  std::vector<Case> cases;
  for (int turns = 1; turns <= 5; ++turns)
    for (int calls : {1, 3}) {
      cases.push_back({"qwen3", conversation(true, turns, calls, false, false)});
      if (calls == 1) cases.push_back({"llama3", conversation(false, turns, 1, false, false)});
    }
  cases.push_back({"qwen3", conversation(true, 3, 2, /*follow_up=*/true, false)});
  cases.push_back({"llama3", conversation(false, 3, 1, /*follow_up=*/true, false)});
  // Reasoning within one user query is kept by Qwen3's template in every turn: still exact.
  cases.push_back({"qwen3", conversation(true, 4, 2, false, /*reasoning=*/true)});
  Json request = Json::array();
  for (const auto& c : cases)
    request.push_back({{"tokenizer_dir", tokenizer_dir(c.model)}, {"messages", c.messages},
                       {"tools", c.model == "qwen3" ? kTools : Json()}, {"add_generation_prompt", false}});
  std::vector<OracleIds> oracle = ask_transformers(request);
  ASSERT_EQ(oracle.size(), cases.size());
  Model models[] = {load_model("llama3"), load_model("qwen3")};
  for (size_t k = 0; k < cases.size(); ++k) {
    const Model& model = cases[k].model == "qwen3" ? models[1] : models[0];
    SCOPED_TRACE("case " + std::to_string(k) + " (" + model.name + "): " + cases[k].messages.dump());
    const std::vector<int32_t>& full = oracle[k].ids;
    std::vector<size_t> sampled_positions;
    Trajectory t = replay(model, cases[k].messages, cases[k].model == "qwen3" ? kTools : Json(), full, &sampled_positions);
    std::vector<int32_t> ids = all_ids(t);
    ASSERT_LE(ids.size(), full.size());
    EXPECT_EQ(ids, std::vector<int32_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(ids.size())));
    // What transformers has past the last sampled token is only what the template writes after the end of
    // the last turn: Qwen's "\n"; the test data's Llama 3 template adds the generation prompt even when not
    // asked to. Nothing of the conversation is missing.
    std::vector<int32_t> rest(full.begin() + static_cast<std::ptrdiff_t>(ids.size()), full.end());
    EXPECT_EQ(model.tokenizer.decode(rest, false),
              model.name == "qwen3" ? "\n" : "<|start_header_id|>assistant<|end_header_id|>\n\n");
    // The mask is 1 on exactly the ids handed over as sampled, 0 on everything the builder appended.
    ASSERT_EQ(t.response_mask.size(), t.response_ids.size());
    std::vector<uint8_t> expected_mask(t.response_ids.size(), 0);
    for (size_t p : sampled_positions) expected_mask.at(p - t.prompt_ids.size()) = 1;
    EXPECT_EQ(t.response_mask, expected_mask);
    int64_t appended = 0;
    for (uint8_t m : t.response_mask) appended += m == 0;
    EXPECT_EQ(appended > 0, t.appended_turns > 0);
  }
}

TEST_F(TokenExactTrajectory, QwenReasoningDroppedByAReRenderIsKeptAsSampled) {
  Model qwen = load_model("qwen3");
  Model llama = load_model("llama3");
  // Detected at start: Qwen3 drops an earlier turn's reasoning once a new user message comes; Llama 3
  // only appends.
  EXPECT_FALSE(TrajectoryBuilder(qwen.tokenizer, qwen.config, kTools).append_only());
  EXPECT_TRUE(TrajectoryBuilder(llama.tokenizer, llama.config).append_only());

  Json messages = conversation(true, 2, 1, /*follow_up=*/true, /*reasoning=*/true);
  // Up to the follow-up, what the model saw: transformers' render of the conversation cut there (every
  // reasoning still after the latest user message, so rendered).
  size_t follow_up = 0;
  for (size_t i = 2; i < messages.size(); ++i)
    if (messages[i]["role"] == "user") follow_up = i;
  Json before = Json::array();
  for (size_t i = 0; i < follow_up; ++i) before.push_back(messages[i]);
  Json request = Json::array({{{"tokenizer_dir", tokenizer_dir("qwen3")}, {"messages", before}, {"tools", kTools}},
                              {{"tokenizer_dir", tokenizer_dir("qwen3")}, {"messages", messages}, {"tools", kTools}}});
  std::vector<OracleIds> oracle = ask_transformers(request);
  ASSERT_EQ(oracle.size(), 2u);
  Trajectory partial = replay(qwen, before, kTools, oracle[0].ids);
  std::vector<int32_t> partial_ids = all_ids(partial);
  EXPECT_EQ(partial_ids, std::vector<int32_t>(oracle[0].ids.begin(), oracle[0].ids.end() - 1));  // less the final "\n"

  // The whole conversation: the trajectory continues from those ids (token in, token out) and keeps the
  // reasoning the model sampled, which transformers' re-render of the finished conversation drops.
  TrajectoryBuilder builder(qwen.tokenizer, qwen.config, kTools);
  builder.start(Json::array({messages[0], messages[1]}));
  // Replay the partial trajectory's sampled turns and deltas, then the follow-up and a last answer.
  size_t cursor = builder.trajectory().prompt_ids.size();
  for (size_t i = 2; i < follow_up;) {
    size_t end = cursor;
    while (oracle[0].ids[end] != qwen.end_of_turn) ++end;
    builder.append_sampled(std::vector<int32_t>(oracle[0].ids.begin() + static_cast<std::ptrdiff_t>(cursor),
                                                oracle[0].ids.begin() + static_cast<std::ptrdiff_t>(end + 1)),
                           messages[i]);
    ++i;
    Json appended = Json::array();
    while (i < follow_up && messages[i]["role"] != "assistant") appended.push_back(messages[i++]);
    if (!appended.empty()) builder.append_messages(appended);
    cursor = builder.trajectory().prompt_ids.size() + builder.trajectory().response_ids.size();
  }
  builder.append_messages(Json::array({messages[follow_up]}));
  std::string text = qwen.tokenizer.decode(all_ids(builder.trajectory()), false);
  EXPECT_NE(text.find("Turn 0: think about it."), std::string::npos) << text;
  EXPECT_NE(text.find("Summarise."), std::string::npos) << text;
  EXPECT_EQ(oracle[1].text.find("Turn 0: think about it."), std::string::npos) << oracle[1].text;
  // The appended follow-up is the same text the re-render has for it, up to the generation prompt.
  const std::string ending = "<|im_end|>\n<|im_start|>user\nAnd tomorrow?<|im_end|>\n<|im_start|>assistant\n";
  ASSERT_GE(text.size(), ending.size());
  EXPECT_EQ(text.substr(text.size() - ending.size()), ending);
  // And its ids are transformers' ids of that render up to the generation prompt: the partial ids, then
  // the follow-up's delta exactly as in the whole re-render.
  std::vector<int32_t> ids = all_ids(builder.trajectory());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(partial_ids.size())), partial_ids);
}

TEST_F(TokenExactTrajectory, RefusesWhatCannotBeAppended) {
  Model qwen = load_model("qwen3");
  TrajectoryBuilder builder(qwen.tokenizer, qwen.config);
  builder.start(Json::array({msg("user", "Hi")}));
  EXPECT_NE(error_of([&] { builder.append_messages(Json::array({msg("user", "again")})); })
                .find("new messages may only follow a sampled assistant turn"),
            std::string::npos);
  // Cut off at the length limit: no end-of-turn token, nothing may follow.
  std::vector<int32_t> cut = qwen.tokenizer.encode("Hello there", false);
  builder.append_sampled(cut, msg("assistant", "Hello there"));
  EXPECT_NE(error_of([&] { builder.append_messages(Json::array({msg("user", "again")})); })
                .find("ended without an end-of-turn token"),
            std::string::npos);
}

}  // namespace
}  // namespace hybridflow::agent
