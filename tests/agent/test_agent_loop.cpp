// Agentic episodes with a scripted policy on the real Qwen3 tokenizer and template: tool calls run and
// answered in order, malformed calls and tool errors shown to the model, interactions, and every limit.
#include "hybridflow/agent/agent_loop.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "hybridflow/agent/command_tool.h"
#include "support/testdata_dir.h"

namespace hybridflow::agent {
namespace {

std::string qwen_dir() { return hybridflow::testing::tokenizer_data_dir() + "/qwen3"; }

Json add_schema() {
  return Json::parse(R"({"type": "function", "function": {"name": "add", "description": "a + b",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}})");
}

class AgentLoop : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(qwen_dir() + "/tokenizer.json"))
        << "no Qwen3 tokenizer in " << hybridflow::testing::tokenizer_data_searched();
    tokenizer_ = std::make_unique<text::Tokenizer>(text::Tokenizer::from_file(qwen_dir() + "/tokenizer.json"));
    config_ = std::make_unique<text::TokenizerConfig>(text::TokenizerConfig::load(qwen_dir() + "/tokenizer_config.json"));
    end_ = *tokenizer_->token_to_id("<|im_end|>");
    tools_.add(std::make_shared<CommandTool>(
        add_schema(),
        std::vector<std::string>{"/usr/bin/python3", "-c",
                                 "import json, sys\na = json.load(sys.stdin)\nprint(a['a'] + a['b'])\n"},
        ProcessBounds{20, 4096}, "test"));
    setup_.tools = &tools_;
  }

  // A policy that says `turns[k]` at its k-th turn (then its end-of-turn token), and records each context.
  TurnSampler scripted(const std::vector<std::string>& turns) {
    return [this, turns](const std::vector<int32_t>& context, int64_t max_new) {
      contexts_.push_back(context);
      const std::string& say = turns.at(std::min(contexts_.size() - 1, turns.size() - 1));
      std::vector<int32_t> ids = tokenizer_->encode(say, false);
      ids.push_back(end_);
      if (static_cast<int64_t>(ids.size()) > max_new) ids.resize(static_cast<size_t>(max_new));
      return ids;
    };
  }

  Episode run(const std::vector<std::string>& turns) {
    TrajectoryBuilder builder(*tokenizer_, *config_, tools_.schemas());
    return run_episode(builder, *tokenizer_, Json::array({{{"role", "user"}, {"content", "What is 2+3?"}}}),
                       scripted(turns), setup_);
  }

  std::string decode(const std::vector<int32_t>& ids) const { return tokenizer_->decode(ids, false); }

  std::unique_ptr<text::Tokenizer> tokenizer_;
  std::unique_ptr<text::TokenizerConfig> config_;
  int32_t end_ = 0;
  ToolSet tools_;
  EpisodeSetup setup_;
  std::vector<std::vector<int32_t>> contexts_;
};

const std::string kCall = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 2, \"b\": 3}}\n</tool_call>";

TEST_F(AgentLoop, CallsRunAndTheirResultsAreTheNextTurnsContext) {
  Episode e = run({"Let me add.\n" + kCall + "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 40, \"b\": 2}}\n</tool_call>",
                   "2+3 = 5."});
  EXPECT_EQ(e.stats.stop, EpisodeStop::answered);
  EXPECT_EQ(e.stats.assistant_turns, 2);
  EXPECT_EQ(e.stats.tool_calls, 2);
  EXPECT_EQ(e.stats.tool_errors, 0);
  EXPECT_EQ(e.stats.per_tool["add"].calls, 2);
  ASSERT_EQ(contexts_.size(), 2u);
  // The second turn's context is the trajectory so far: the results in call order, then the prompt of the
  // next assistant turn.
  std::string second = decode(contexts_[1]);
  size_t five = second.find("<tool_response>\n5\n</tool_response>");
  size_t forty_two = second.find("<tool_response>\n42\n</tool_response>");
  ASSERT_NE(five, std::string::npos) << second;
  ASSERT_NE(forty_two, std::string::npos) << second;
  EXPECT_LT(five, forty_two);
  EXPECT_EQ(second.substr(second.size() - 22), "<|im_start|>assistant\n");
  // Messages for scorers: the parsed calls and the tool results.
  const Json& messages = e.trajectory.messages;
  ASSERT_EQ(messages.size(), 5u);
  EXPECT_EQ(messages[1]["content"], "Let me add.");
  EXPECT_EQ(messages[1]["tool_calls"][1]["function"]["arguments"], (Json{{"a", 40}, {"b", 2}}));
  EXPECT_EQ(messages[3]["content"], "42");
  // Sampled ids as sampled, mask 1 on them only.
  int64_t ones = 0;
  for (uint8_t m : e.trajectory.response_mask) ones += m;
  EXPECT_EQ(ones, e.stats.sampled_tokens);
  EXPECT_EQ(static_cast<int64_t>(e.trajectory.response_ids.size()), e.stats.sampled_tokens + e.stats.appended_tokens);
  std::vector<int32_t> first_turn = tokenizer_->encode(
      "Let me add.\n" + kCall + "\n<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 40, \"b\": 2}}\n</tool_call>", false);
  first_turn.push_back(end_);
  EXPECT_EQ(std::vector<int32_t>(e.trajectory.response_ids.begin(),
                                 e.trajectory.response_ids.begin() + static_cast<std::ptrdiff_t>(first_turn.size())),
            first_turn);
}

TEST_F(AgentLoop, MalformedCallsUnknownToolsAndBadArgumentsAreToolMessagesNotFailures) {
  Episode e = run({"<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1</tool_call>\n"
                   "<tool_call>{\"name\": \"search\", \"arguments\": {}}</tool_call>\n"
                   "<tool_call>{\"name\": \"add\", \"arguments\": {\"a\": 1}}</tool_call>",
                   "I could not add."});
  EXPECT_EQ(e.stats.stop, EpisodeStop::answered);
  EXPECT_EQ(e.stats.malformed_calls, 1);
  EXPECT_EQ(e.stats.tool_calls, 2);
  EXPECT_EQ(e.stats.tool_errors, 2);
  EXPECT_EQ(e.stats.per_tool["search"].errors["unknown_tool"], 1);
  EXPECT_EQ(e.stats.per_tool["add"].errors["invalid_arguments"], 1);
  const Json& messages = e.trajectory.messages;
  ASSERT_EQ(messages.size(), 6u);  // user, assistant, 3 tool messages in the order written, assistant
  EXPECT_NE(messages[2]["content"].get<std::string>().find("Error: tool call 1: invalid JSON"), std::string::npos)
      << messages[2];
  EXPECT_NE(messages[3]["content"].get<std::string>().find("no tool named 'search'"), std::string::npos) << messages[3];
  EXPECT_NE(messages[4]["content"].get<std::string>().find("missing required argument 'b'"), std::string::npos)
      << messages[4];
}

TEST_F(AgentLoop, Limits) {
  setup_.limits.max_assistant_turns = 2;
  Episode turns = run({kCall});  // calls forever
  EXPECT_EQ(turns.stats.stop, EpisodeStop::max_assistant_turns);
  EXPECT_EQ(turns.stats.assistant_turns, 2);
  EXPECT_EQ(turns.stats.tool_calls, 1);  // the last turn's calls are not run

  contexts_.clear();
  setup_.limits.max_assistant_turns = 10;
  setup_.limits.max_response_tokens = 60;
  Episode budget = run({kCall});
  EXPECT_EQ(budget.stats.stop, EpisodeStop::response_length);
  EXPECT_LE(static_cast<int64_t>(budget.trajectory.response_ids.size()), 60);
  for (size_t k = 0; k < contexts_.size(); ++k)
    EXPECT_LE(contexts_[k].size() - budget.trajectory.prompt_ids.size(), 60u);

  // A turn cut off at the budget (no end-of-turn token) ends the episode.
  contexts_.clear();
  setup_.limits.max_response_tokens = 5;
  Episode cut = run({"This answer is far longer than five tokens."});
  EXPECT_EQ(cut.stats.stop, EpisodeStop::response_length);
  EXPECT_EQ(cut.trajectory.response_ids.size(), 5u);
  EXPECT_NE(cut.trajectory.response_ids.back(), end_);
}

TEST_F(AgentLoop, AnInteractionGivesUserTurnsUntilDone) {
  AnswerCheckInteraction check("check", 3, "Correct.", "Wrong, try again.");
  setup_.interaction = &check;
  setup_.interaction_kwargs = {{"ground_truth", "5"}};
  Episode e = run({"It is 4.", kCall, "It is 5."});
  EXPECT_EQ(e.stats.stop, EpisodeStop::interaction_done);
  EXPECT_EQ(e.stats.user_turns, 1);
  EXPECT_EQ(e.stats.interaction_rewards, (std::vector<double>{0.0, 1.0}));
  std::string text = decode(e.trajectory.response_ids);
  EXPECT_NE(text.find("<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\n"), std::string::npos) << text;

  contexts_.clear();
  setup_.limits.max_user_turns = 1;
  Episode stubborn = run({"It is 4."});
  EXPECT_EQ(stubborn.stats.stop, EpisodeStop::max_user_turns);
  EXPECT_EQ(stubborn.stats.user_turns, 1);

  contexts_.clear();
  setup_.interaction_kwargs = Json::object();  // no ground truth: the interaction fails, the episode ends
  Episode failed = run({"It is 4."});
  EXPECT_EQ(failed.stats.stop, EpisodeStop::interaction_failed);
  EXPECT_NE(failed.stats.interaction_error.find("no ground_truth"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow::agent
