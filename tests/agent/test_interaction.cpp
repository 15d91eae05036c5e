// Interactions (simulated users between turns): built in, as a command, over HTTP, and their config file.
#include "hybridflow/agent/interaction.h"

#include <gtest/gtest.h>

#include "hybridflow/core/fs.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "support/tiny_http_server.h"

namespace hybridflow::agent {
namespace {

using hybridflow::testing::error_of;
using hybridflow::testing::http_reply;
using hybridflow::testing::TempDir;
using hybridflow::testing::TinyServer;

Json conversation(const std::vector<std::string>& answers) {
  Json messages = Json::array({{{"role", "user"}, {"content", "What is 6*7?"}}});
  for (const auto& a : answers) {
    messages.push_back({{"role", "assistant"}, {"content", a}});
    messages.push_back({{"role", "user"}, {"content", "Try again."}});
  }
  if (!answers.empty()) messages.erase(messages.size() - 1);
  return messages;
}

TEST(AnswerCheckInteraction, RewardsTheRightAnswerAndEndsAfterMaxAttempts) {
  AnswerCheckInteraction check("gsm8k", 2, "Correct.", "No, try again.");
  Json kwargs = {{"ground_truth", "42"}};
  InteractionTurn wrong = check.respond(conversation({"It is 40."}), kwargs);
  EXPECT_FALSE(wrong.done);
  EXPECT_EQ(wrong.message, "No, try again.");
  EXPECT_EQ(wrong.reward, 0.0);
  InteractionTurn right = check.respond(conversation({"It is 40.", "#### 42"}), kwargs);
  EXPECT_TRUE(right.done);
  EXPECT_EQ(right.reward, 1.0);
  EXPECT_EQ(right.message, "Correct.");
  InteractionTurn out_of_tries = check.respond(conversation({"40", "41"}), kwargs);
  EXPECT_TRUE(out_of_tries.done);
  EXPECT_EQ(out_of_tries.reward, 0.0);
  EXPECT_TRUE(out_of_tries.error.empty());
  InteractionTurn no_truth = check.respond(conversation({"42"}), Json::object());
  EXPECT_TRUE(no_truth.done);
  EXPECT_NE(no_truth.error.find("interaction 'gsm8k' (answer_check): the row's interaction_kwargs have no ground_truth"),
            std::string::npos)
      << no_truth.error;
}

TEST(CommandInteraction, GetsTheConversationAndKwargsAndRepliesInJson) {
  // Counts the messages it was given and echoes a kwarg back.
  CommandInteraction user("sim", {"/usr/bin/python3", "-c",
                                  "import json, sys\nr = json.load(sys.stdin)\n"
                                  "print(json.dumps({'message': '%d messages, topic %s' % (len(r['messages']), "
                                  "r['kwargs']['topic']), 'done': len(r['messages']) > 2, 'reward': 0.25}))\n"},
                          {10.0, 1 << 16});
  InteractionTurn turn = user.respond(conversation({"a"}), Json{{"topic", "maths"}});
  ASSERT_TRUE(turn.error.empty()) << turn.error;
  EXPECT_EQ(turn.message, "2 messages, topic maths");
  EXPECT_FALSE(turn.done);
  EXPECT_EQ(turn.reward, 0.25);
  EXPECT_TRUE(user.respond(conversation({"a", "b"}), Json{{"topic", "x"}}).done);

  CommandInteraction broken("sim", {"/bin/sh", "-c", "echo '{\"message\": 1}'"}, {10.0, 1 << 16});
  InteractionTurn bad = broken.respond(conversation({}), nullptr);
  EXPECT_TRUE(bad.done);
  EXPECT_NE(bad.error.find("interaction 'sim' (command 'echo '{\"message\": 1}'')"), std::string::npos) << bad.error;
  EXPECT_NE(bad.error.find("the reply needs \"message\" (a string)"), std::string::npos) << bad.error;
  CommandInteraction slow("sim", {"sleep", "30"}, {0.3, 1 << 16});
  EXPECT_NE(slow.respond(conversation({}), nullptr).error.find("no reply within 0.3 s"), std::string::npos);
}

TEST(HttpInteraction, PostsTheConversation) {
  TinyServer server([](const std::string&, const std::string& body) {
    Json request = Json::parse(body);
    std::string last = request["messages"].back()["content"];
    return http_reply(200, Json{{"message", "you said: " + last}, {"done", true}, {"reward", nullptr}}.dump());
  });
  HttpInteraction user("web", server.url("/turn"), {5.0, 1 << 16}, {}, "test");
  InteractionTurn turn = user.respond(conversation({"hello"}), nullptr);
  ASSERT_TRUE(turn.error.empty()) << turn.error;
  EXPECT_EQ(turn.message, "you said: hello");
  EXPECT_TRUE(turn.done);
  EXPECT_FALSE(turn.reward.has_value());
  TinyServer down([](const std::string&, const std::string&) { return http_reply(500, "boom"); });
  InteractionTurn failed = HttpInteraction("web", down.url(), {5.0, 1 << 16}, {}, "test").respond(conversation({}), nullptr);
  EXPECT_TRUE(failed.done);
  EXPECT_NE(failed.error.find("answered HTTP 500: boom"), std::string::npos) << failed.error;
}

TEST(InteractionConfig, VerlLayoutAndErrors) {
  TempDir dir;
  write_file_atomic(dir.file("interaction.yaml"),
                    "interaction:\n"
                    "  - name: gsm8k\n"
                    "    class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n"
                    "    config: {type: answer_check, max_attempts: 3}\n"
                    "  - name: user\n"
                    "    config: {type: command, command: 'cat >/dev/null; echo {\\\"message\\\": \\\"hi\\\", \\\"done\\\": true}'}\n");
  Interactions loaded = load_interaction_config(dir.file("interaction.yaml"));
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded.at("gsm8k")->describe(), "answer_check");
  InteractionTurn hi = loaded.at("user")->respond(conversation({}), nullptr);
  EXPECT_EQ(hi.message, "hi") << hi.error;
  auto load_error = [](const std::string& yaml) {
    return error_of([&] { load_interaction_config_from_string(yaml, "i.yaml", ""); });
  };
  std::string msg = load_error("interaction:\n  - name: a\n    config: {type: answer_check, attempts: 2}\n");
  EXPECT_NE(msg.find("i.yaml: interaction[0] ('a') (line 3): unknown key 'config.attempts'; did you mean "
                     "'config.max_attempts'?"),
            std::string::npos)
      << msg;
  msg = load_error("interaction:\n  - name: a\n    class_name: my.Interaction\n    config: {}\n");
  EXPECT_NE(msg.find("config.type: expected command, http or answer_check, got ''"), std::string::npos) << msg;
  msg = load_error("interaction:\n  - config: {type: answer_check}\n");
  EXPECT_NE(msg.find("i.yaml: interaction[0] (line 2): name: missing"), std::string::npos) << msg;
  msg = load_error("interaction:\n  - {name: a, config: {type: answer_check}}\n  - {name: a, config: {type: answer_check}}\n");
  EXPECT_NE(msg.find("an interaction named 'a' is already defined"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hybridflow::agent
