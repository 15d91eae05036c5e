#include "hybridflow/workers/reward_function.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <chrono>
#include <fstream>
#include <functional>
#include <thread>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/workers/command_reward.h"
#include "hybridflow/workers/http_reward.h"
#include "hybridflow/workers/task_reward.h"
#include "support/temp_dir.h"
#include "support/error_of.h"
#include "support/tiny_http_server.h"

namespace hybridflow {
namespace {

using testing::TempDir;
using testing::TinyServer;
using testing::http_reply;
using Clock = std::chrono::steady_clock;

std::vector<RewardRequest> make_batch(const std::vector<std::string>& responses) {
  std::vector<RewardRequest> batch;
  for (size_t i = 0; i < responses.size(); ++i)
    batch.push_back({"prompt " + std::to_string(i), responses[i], "right", nlohmann::json::object()});
  return batch;
}

std::string write_script(const TempDir& dir, const std::string& name, const std::string& body) {
  std::string path = dir.file(name);
  write_file_atomic(path, "#!/bin/sh\n" + body);
  ::chmod(path.c_str(), 0755);
  return path;
}

using hybridflow::testing::error_of;

TEST(ParseScoreLine, AcceptsNumbersAndScoreObjects) {
  EXPECT_DOUBLE_EQ(parse_score_line("0.5", "x"), 0.5);
  EXPECT_DOUBLE_EQ(parse_score_line(" -2 ", "x"), -2.0);
  EXPECT_DOUBLE_EQ(parse_score_line("{\"score\": 3.25, \"why\": \"ok\"}", "x"), 3.25);
  std::string msg = error_of([] { parse_score_line("\"1\"", "cmd line 4"); });
  EXPECT_NE(msg.find("cmd line 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'\"1\"'"), std::string::npos) << msg;
  EXPECT_NE(error_of([] { parse_score_line("{\"s\": 1}", "x"); }).find("{\"score\": x}"), std::string::npos);
  EXPECT_NE(error_of([] { parse_score_line("oops", "x"); }).find("'oops'"), std::string::npos);
}

TEST(RewardRequest, JsonHasNamedFieldsAndExtras) {
  RewardRequest r{"p", "r", "a", {{"source", "gsm8k"}, {"prompt", "shadowed"}, {"data_source", "shadowed too"}}};
  nlohmann::json j = reward_request_to_json(r);
  EXPECT_EQ(j["prompt"], "p");
  EXPECT_EQ(j["response"], "r");
  EXPECT_EQ(j["answer"], "a");
  EXPECT_EQ(j["ground_truth"], "a");
  EXPECT_EQ(j["data_source"], "");
  EXPECT_EQ(j["extra_info"], nlohmann::json::object());
  EXPECT_EQ(j["source"], "gsm8k");
  r.data_source = "openai/gsm8k";
  r.extra_info = {{"split", "train"}, {"index", 7}};
  j = reward_request_to_json(r);
  EXPECT_EQ(j["data_source"], "openai/gsm8k");
  EXPECT_EQ(j["extra_info"], (nlohmann::json{{"split", "train"}, {"index", 7}}));
  r.extra = nlohmann::json::array();
  EXPECT_NE(error_of([&] { reward_request_to_json(r); }).find("JSON object"), std::string::npos);
}

TEST(CommandReward, ScoresEachLineWithAwk) {
  // The scorer sees one JSON object per line: "right" responses get 1.5, others 0.25 * line number.
  CommandReward reward = CommandReward::shell(
      R"(awk '/"response":"right"/ { print "{\"score\": 1.5}"; next } { print NR * 0.25 }')", 10.0);
  std::vector<double> scores = reward.score(make_batch({"right", "wrong", "also wrong", "right"}));
  EXPECT_EQ(scores, (std::vector<double>{1.5, 0.5, 0.75, 1.5}));
  EXPECT_TRUE(reward.score({}).empty());
}

TEST(CommandReward, SendsPromptResponseAnswerVerlFieldsAndExtras) {
  TempDir dir;
  std::string seen = dir.file("seen.jsonl");
  CommandReward reward({"/bin/sh", "-c", "tee \"$0\" | awk '{ print 0 }'", seen}, 10.0);
  auto batch = make_batch({"a\nmultiline \"quoted\" answer", "b"});
  batch[1].extra = {{"difficulty", "hard"}};
  batch[1].data_source = "openai/gsm8k";
  batch[1].extra_info = {{"split", "test"}, {"index", 3}, {"tags", {"x", "y"}}};
  EXPECT_EQ(reward.score(batch), (std::vector<double>{0, 0}));
  std::vector<nlohmann::json> rows = read_jsonl(seen);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0], (nlohmann::json{{"prompt", "prompt 0"}, {"response", "a\nmultiline \"quoted\" answer"},
                                     {"answer", "right"}, {"ground_truth", "right"}, {"data_source", ""},
                                     {"extra_info", nlohmann::json::object()}}));
  EXPECT_EQ(rows[1]["difficulty"], "hard");
  EXPECT_EQ(rows[1]["data_source"], "openai/gsm8k");
  EXPECT_EQ(rows[1]["ground_truth"], "right");
  EXPECT_EQ(rows[1]["extra_info"], (nlohmann::json{{"split", "test"}, {"index", 3}, {"tags", {"x", "y"}}}));
}

TEST(CommandReward, ArgvIsNotReparsedByAShell) {
  TempDir dir;
  std::string script = write_script(dir, "count_args.sh", "while read -r line; do echo \"$#\"; done\n");
  std::string marker = dir.file("PWNED");
  CommandReward reward({script, "one arg; touch " + marker}, 10.0);
  EXPECT_EQ(reward.score(make_batch({"x", "y"})), (std::vector<double>{1, 1}));
  EXPECT_FALSE(file_exists(marker));
  EXPECT_NE(reward.describe().find("count_args.sh"), std::string::npos);
}

TEST(CommandReward, NonZeroExitNamesCommandStatusAndStderr) {
  CommandReward reward = CommandReward::shell("cat > /dev/null; echo 'bad config' >&2; exit 3", 10.0);
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("exited with status 3"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bad config"), std::string::npos) << msg;
  EXPECT_NE(msg.find("command 'cat > /dev/null"), std::string::npos) << msg;
}

TEST(CommandReward, TimeoutKillsTheChildQuickly) {
  CommandReward reward = CommandReward::shell("sleep 20; echo 1", 0.3);
  auto start = Clock::now();
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_NE(msg.find("timed out after 0.3 s"), std::string::npos) << msg;
  EXPECT_LT(elapsed, 5.0);  // the `sleep` grandchild was killed with its process group, not waited for
}

// True once `pid` has exited: no /proc entry, or a zombie waiting for its new parent to reap it.
bool process_gone(long pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text)) return true;
  size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] == 'Z' || text[paren + 2] == 'X';
}

// Waits (bounded) for every pid listed in `pid_file` to be gone; returns those still running.
std::vector<long> still_running(const std::string& pid_file) {
  std::vector<long> pids;
  std::ifstream in(pid_file);
  for (long pid; in >> pid;) pids.push_back(pid);
  EXPECT_FALSE(pids.empty()) << pid_file << " lists no pids";
  // SIGKILL is delivered asynchronously: give the kernel a moment, not a timing assertion.
  auto deadline = Clock::now() + std::chrono::seconds(5);
  std::vector<long> left = pids;
  while (!left.empty() && Clock::now() < deadline) {
    left.erase(std::remove_if(left.begin(), left.end(), process_gone), left.end());
    if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (long pid : left) ::kill(static_cast<pid_t>(pid), SIGKILL);  // leave nothing behind either way
  return left;
}

TEST(CommandReward, TimeoutKillsEveryProcessOfTheCommand) {
  TempDir dir;
  const std::string pids = dir.file("pids");
  CommandReward reward = CommandReward::shell(
      "sleep 100 & echo $! > " + pids + "; sleep 100 & echo $! >> " + pids + "; echo $$ >> " + pids + "; wait", 0.3);
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("timed out after 0.3 s"), std::string::npos) << msg;
  EXPECT_EQ(still_running(pids), std::vector<long>{});
}

TEST(CommandReward, BackgroundChildrenAreKilledWhenTheCommandExits) {
  // The child's output goes elsewhere, so the pipes close and the command "succeeds" with it still running.
  TempDir dir;
  const std::string pids = dir.file("pids");
  CommandReward reward =
      CommandReward::shell("sleep 100 >/dev/null 2>&1 & echo $! > " + pids + "; cat > /dev/null; echo 1", 10.0);
  EXPECT_EQ(reward.score(make_batch({"x"})), (std::vector<double>{1.0}));
  EXPECT_EQ(still_running(pids), std::vector<long>{});
}

TEST(CommandReward, EndlessOutputIsCutOffAtTheByteLimit) {
  // Without a bound, `cat /dev/zero` grows the trainer's buffer until bad_alloc.
  CommandReward reward = CommandReward::shell("cat /dev/zero", 30.0, 1 << 20);
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("command 'cat /dev/zero' wrote more than 1048576 bytes to stdout"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reward.max_output_bytes"), std::string::npos) << msg;

  CommandReward to_stderr = CommandReward::shell("cat /dev/zero >&2", 30.0, 1 << 20);
  msg = error_of([&] { to_stderr.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("wrote more than 1048576 bytes to stderr"), std::string::npos) << msg;

  // Output at the limit is fine.
  CommandReward at_limit = CommandReward::shell("cat > /dev/null; printf '1\\n'", 30.0, 2);
  EXPECT_EQ(at_limit.score(make_batch({"x"})), (std::vector<double>{1.0}));
}

TEST(CommandReward, WrongLineCountIsAnError) {
  CommandReward reward = CommandReward::shell("cat > /dev/null; echo 1", 10.0);
  std::string msg = error_of([&] { reward.score(make_batch({"x", "y", "z"})); });
  EXPECT_NE(msg.find("printed 1 lines"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(3)"), std::string::npos) << msg;
}

TEST(CommandReward, GarbageOutputNamesTheLine) {
  CommandReward reward = CommandReward::shell("cat > /dev/null; echo 1; echo 'score: high'", 10.0);
  std::string msg = error_of([&] { reward.score(make_batch({"x", "y"})); });
  EXPECT_NE(msg.find("stdout line 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("score: high"), std::string::npos) << msg;
}

TEST(CommandReward, ProgramThatIgnoresStdinStillWorks) {
  // Many lines and a scorer that never reads them: the broken pipe must not kill the test process.
  CommandReward reward = CommandReward::shell("i=0; while [ $i -lt 3000 ]; do echo 2; i=$((i+1)); done", 10.0);
  std::vector<RewardRequest> batch(3000, RewardRequest{"p", std::string(200, 'r'), "a", {}});
  std::vector<double> scores = reward.score(batch);
  ASSERT_EQ(scores.size(), 3000u);
  EXPECT_EQ(scores.back(), 2.0);
}

TEST(CommandReward, MissingProgramIsReported) {
  CommandReward reward({"/nonexistent/score-prog", "--x"}, 5.0);
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("cannot run '/nonexistent/score-prog'"), std::string::npos) << msg;
}

TEST(CommandReward, PythonScorerWhenAvailable) {
  if (!file_exists("/usr/bin/python3")) GTEST_SKIP() << "no /usr/bin/python3";
  TempDir dir;
  std::string script = dir.file("score.py");
  write_file_atomic(script,
                    "import json, sys\n"
                    "for line in sys.stdin:\n"
                    "    r = json.loads(line)\n"
                    "    print(json.dumps({'score': float(r['response'].strip() == r['answer'])}))\n");
  CommandReward reward({"/usr/bin/python3", script}, 30.0);
  EXPECT_EQ(reward.score(make_batch({"right", " wrong", "right "})), (std::vector<double>{1, 0, 1}));
}

// Scores each response by its length, computed by the server from the JSON it received.
std::string length_scores(const std::string& /*head*/, const std::string& body) {
  nlohmann::json scores = nlohmann::json::array();
  nlohmann::json request = nlohmann::json::parse(body);
  for (const auto& row : request["batch"]) scores.push_back(row["response"].get<std::string>().size());
  return http_reply(200, nlohmann::json{{"scores", scores}}.dump());
}

TEST(HttpReward, PostsTheBatchAndReadsScores) {
  TinyServer server(length_scores);
  HttpReward reward(server.url(), 5.0);
  EXPECT_EQ(reward.score(make_batch({"a", "abcd", ""})), (std::vector<double>{1, 4, 0}));
  std::string head = server.last_head();
  EXPECT_EQ(head.rfind("POST /score HTTP/1.1\r\n", 0), 0u) << head;
  EXPECT_NE(head.find("Content-Type: application/json"), std::string::npos) << head;
}

TEST(HttpReward, SendsVerlFieldsOfEachSample) {
  nlohmann::json received;
  TinyServer server([&](const std::string&, const std::string& body) {
    received = nlohmann::json::parse(body);
    return http_reply(200, R"({"scores": [1]})");
  });
  HttpReward reward(server.url(), 5.0);
  auto batch = make_batch({"46"});
  batch[0].data_source = "addition";
  batch[0].extra_info = {{"split", "train"}, {"index", 0}};
  EXPECT_EQ(reward.score(batch), (std::vector<double>{1}));
  ASSERT_EQ(received["batch"].size(), 1u);
  const auto& row = received["batch"][0];
  EXPECT_EQ(row["data_source"], "addition");
  EXPECT_EQ(row["ground_truth"], "right");
  EXPECT_EQ(row["answer"], "right");
  EXPECT_EQ(row["extra_info"], (nlohmann::json{{"split", "train"}, {"index", 0}}));
}

TEST(HttpReward, ReadsChunkedReplies) {
  TinyServer server([](const std::string&, const std::string&) {
    return std::string("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"sco\r\na\r\nres\": [7]}\r\n0\r\n\r\n");
  });
  HttpReward reward(server.url(), 5.0);
  EXPECT_EQ(reward.score(make_batch({"x"})), (std::vector<double>{7}));
}

TEST(HttpReward, ConnectionRefusedNamesHostAndPort) {
  int port = 0;
  {
    TinyServer closed([](const std::string&, const std::string&) { return std::string(); });
    port = closed.port();
  }
  HttpReward reward("http://127.0.0.1:" + std::to_string(port) + "/score", 2.0);
  std::string msg = error_of([&] { reward.score(make_batch({"x"})); });
  EXPECT_NE(msg.find("cannot connect to 127.0.0.1:" + std::to_string(port)), std::string::npos) << msg;
}

TEST(HttpReward, Non200StatusIsReportedWithBody) {
  TinyServer server([](const std::string&, const std::string&) { return http_reply(500, "scorer crashed"); });
  std::string msg = error_of([&] { HttpReward(server.url(), 5.0).score(make_batch({"x"})); });
  EXPECT_NE(msg.find("HTTP 500"), std::string::npos) << msg;
  EXPECT_NE(msg.find("scorer crashed"), std::string::npos) << msg;
}

TEST(HttpReward, BadJsonAndWrongShapesAreReported) {
  TinyServer not_json([](const std::string&, const std::string&) { return http_reply(200, "<html>"); });
  EXPECT_NE(error_of([&] { HttpReward(not_json.url(), 5.0).score(make_batch({"x"})); }).find("not JSON"),
            std::string::npos);
  TinyServer no_scores([](const std::string&, const std::string&) { return http_reply(200, "{\"s\": [1]}"); });
  EXPECT_NE(error_of([&] { HttpReward(no_scores.url(), 5.0).score(make_batch({"x"})); }).find("{\"scores\""),
            std::string::npos);
  TinyServer wrong_count([](const std::string&, const std::string&) { return http_reply(200, "{\"scores\": [1]}"); });
  EXPECT_NE(error_of([&] { HttpReward(wrong_count.url(), 5.0).score(make_batch({"x", "y"})); })
                .find("got 1 scores for a batch of 2"),
            std::string::npos);
  TinyServer text_score([](const std::string&, const std::string&) { return http_reply(200, "{\"scores\": [\"1\"]}"); });
  EXPECT_NE(error_of([&] { HttpReward(text_score.url(), 5.0).score(make_batch({"x"})); }).find("scores[0]"),
            std::string::npos);
}

TEST(HttpReward, SilentServerTimesOut) {
  TinyServer silent([](const std::string&, const std::string&) { return std::string(); });
  auto start = Clock::now();
  std::string msg = error_of([&] { HttpReward(silent.url(), 0.3).score(make_batch({"x"})); });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 3.0);
  EXPECT_NE(msg.find("no complete reply from " + silent.url() + " within 0.3 s"), std::string::npos) << msg;
}

TEST(HttpReward, SlowDripBodyHitsTheWholeRequestDeadline) {
  // Each byte arrives well within the timeout; the request as a whole does not.
  TinyServer drip([](const std::string&, const std::string&) { return std::string("HTTP/1.1 200 OK\r\n\r\n"); },
                  [](int fd, const std::atomic<bool>& stop) {
                    while (!stop && ::send(fd, " ", 1, MSG_NOSIGNAL) == 1)
                      std::this_thread::sleep_for(std::chrono::milliseconds(10));
                  });
  auto start = Clock::now();
  std::string msg = error_of([&] { HttpReward(drip.url(), 0.3).score(make_batch({"x"})); });
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - start).count(), 5.0);
  EXPECT_NE(msg.find("no complete reply from " + drip.url() + " within 0.3 s"), std::string::npos) << msg;
}

TEST(HttpReward, BodyOverTheByteLimitIsRefused) {
  // Announced: refused from the header alone.
  TinyServer announced([](const std::string&, const std::string&) {
    return std::string("HTTP/1.1 200 OK\r\nContent-Length: 2000000000\r\n\r\n{");
  });
  std::string msg = error_of([&] { HttpReward(announced.url(), 5.0, {}, 1 << 16).score(make_batch({"x"})); });
  EXPECT_NE(msg.find(announced.url() + " announced a reply body of 2000000000 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("reward.max_output_bytes (65536)"), std::string::npos) << msg;

  // Unannounced (read to EOF): cut off once the limit is passed, not read to the end.
  TinyServer endless([](const std::string&, const std::string&) { return std::string("HTTP/1.1 200 OK\r\n\r\n"); },
                     [](int fd, const std::atomic<bool>& stop) {
                       const std::string chunk(1 << 16, ' ');
                       while (!stop && ::send(fd, chunk.data(), chunk.size(), MSG_NOSIGNAL) > 0) {
                       }
                     });
  msg = error_of([&] { HttpReward(endless.url(), 30.0, {}, 1 << 20).score(make_batch({"x"})); });
  EXPECT_NE(msg.find("the reply body from " + endless.url() + " exceeds 1048576 bytes"), std::string::npos) << msg;

  // A body exactly at the limit is read.
  const std::string body = "{\"scores\": [1]}";
  TinyServer exact([&](const std::string&, const std::string&) { return http_reply(200, body); });
  EXPECT_EQ(HttpReward(exact.url(), 5.0, {}, static_cast<int64_t>(body.size())).score(make_batch({"x"})),
            (std::vector<double>{1.0}));
}

TEST(HttpReward, UrlParsingAndHostPolicy) {
  HttpUrl u = parse_http_url("http://localhost:8080/a/b?x=1");
  EXPECT_EQ(u.host, "localhost");
  EXPECT_EQ(u.port, 8080);
  EXPECT_EQ(u.path, "/a/b?x=1");
  HttpUrl v6 = parse_http_url("http://[::1]:9");
  EXPECT_EQ(v6.host, "::1");
  EXPECT_EQ(v6.port, 9);
  EXPECT_EQ(v6.path, "/");
  EXPECT_NE(error_of([] { parse_http_url("https://127.0.0.1/"); }).find("only plain http"), std::string::npos);
  EXPECT_NE(error_of([] { parse_http_url("http://127.0.0.1:99999/"); }).find("bad port '99999'"), std::string::npos);
  EXPECT_NE(error_of([] { HttpReward("http://scores.example.com:80/", 1.0); }).find("reward.allowed_hosts"),
            std::string::npos);
  EXPECT_NO_THROW(HttpReward("http://scores.example.com:80/", 1.0, {"scores.example.com"}));
}

RewardFunctionSpec command_spec(const std::string& shell) {
  RewardFunctionSpec spec;
  spec.type = "command";
  spec.shell = shell;
  return spec;
}

TEST(MakeRewardFunction, BuildsCommandAndHttpRewardsFromTheirSpec) {
  auto shell = make_reward_function(command_spec("awk '{ print 0.5 }'"));
  EXPECT_EQ(shell->score(make_batch({"x", "y"})), (std::vector<double>{0.5, 0.5}));
  RewardFunctionSpec argv_spec;
  argv_spec.type = "command";
  argv_spec.command = std::vector<std::string>{"/bin/sh", "-c", "awk \"{ print 2 }\""};
  auto argv = make_reward_function(argv_spec);
  EXPECT_EQ(argv->score(make_batch({"x"})), (std::vector<double>{2}));

  TinyServer server(length_scores);
  RewardFunctionSpec http_spec;
  http_spec.type = "http";
  http_spec.url = server.url();
  http_spec.timeout_s = 5;
  auto http = make_reward_function(http_spec);
  EXPECT_EQ(http->score(make_batch({"abc"})), (std::vector<double>{3}));
}

TEST(TaskReward, UsesTheTaskRuleWithTheRequestAnswerAsReference) {
  std::shared_ptr<const Task> task = make_task("addition");
  std::mt19937_64 rng(7);
  Example example = task->sample(rng);
  TaskReward reward(task);
  std::vector<RewardRequest> batch = {{example.prompt, " " + example.answer + "\n", example.answer, {}},
                                      {example.prompt, example.answer + "1", example.answer, {}}};
  EXPECT_EQ(reward.score(batch), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(reward.describe(), "task 'addition'");

  RewardFunctionSpec spec;  // type task
  spec.task = "addition";
  auto from_spec = make_reward_function(spec);
  EXPECT_EQ(from_spec->score(batch), (std::vector<double>{1.0, 0.0}));
  EXPECT_NE(error_of([] { make_reward_function(RewardFunctionSpec{}); }).find("reward.task"), std::string::npos);
  spec.task = "no_such_task";
  EXPECT_THROW(make_reward_function(spec), Error);
}

TEST(MakeRewardFunction, SpecErrorsNameTheSectionAndKey) {
  RewardFunctionSpec magic;
  magic.type = "magic";
  EXPECT_NE(error_of([&] { make_reward_function(magic); }).find("reward.type"), std::string::npos);
  RewardFunctionSpec command;
  command.type = "command";
  EXPECT_NE(error_of([&] { make_reward_function(command); }).find("reward.command"), std::string::npos);
  command.command = std::vector<std::string>{"cat"};
  command.shell = "cat";
  EXPECT_NE(error_of([&] { make_reward_function(command); }).find("exactly one of"), std::string::npos);
  RewardFunctionSpec http;
  http.section = "cost";
  http.type = "http";
  EXPECT_NE(error_of([&] { make_reward_function(http); }).find("cost.url"), std::string::npos);
  RewardFunctionSpec no_output = command_spec("cat");
  no_output.max_output_bytes = 0;
  EXPECT_NE(error_of([&] { make_reward_function(no_output); }).find("reward.max_output_bytes: expected > 0"),
            std::string::npos);
}

TEST(MakeRewardFunction, MaxOutputBytesComesFromTheSpec) {
  RewardFunctionSpec spec = command_spec("cat > /dev/null; seq 1000");
  spec.max_output_bytes = 100;
  auto reward = make_reward_function(spec);
  std::string msg = error_of([&] { reward->score(make_batch({"x"})); });
  EXPECT_NE(msg.find("wrote more than 100 bytes to stdout"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hybridflow
