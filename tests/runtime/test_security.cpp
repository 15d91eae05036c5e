// Strangers on the controller's ports: real worker pools and a launch under attack while genuine work
// runs: every bad message is rejected, counted and logged once, and the run's results still arrive. (The
// message layer's own checks are tests/transport/test_message_link.cpp.)
#include <cstdlib>

// Small enough that a test can exceed it cheaply; set before anything reads it, inherited by workers.
static const bool kSmallMessageLimit = (::setenv("HF_MAX_MESSAGE_BYTES", "262144", 1), true);

#include "runtime/launch_test_job.h"

#include <sys/stat.h>

#include <atomic>
#include <future>

#include "hybridflow/core/printable.h"
#include "hybridflow/transport/launcher.h"
#include "transport/link_test_support.h"
#include "support/error_of.h"

using hybridflow::testing::error_of;
using hybridflow::transport_testing::hello;
using hybridflow::transport_testing::intruder;
using hybridflow::transport_testing::kSecret;
using hybridflow::transport_testing::send_raw;
using transport_detail::kControllerEnd;
using transport_detail::Link;

namespace {

void wait_for_rejections(const ProcessPool& pool, size_t n) {
  auto t0 = std::chrono::steady_clock::now();
  while (pool.rejected_messages() < n && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
}

}  // namespace

TEST(Printable, EscapesControlCharactersAndCutsLongText) {
  EXPECT_EQ(printable("node-1.example"), "node-1.example");
  EXPECT_EQ(printable("a\nERROR x\r\t\x1b[31m\\"), "a\\nERROR x\\r\\t\\x1b[31m\\\\");
  EXPECT_EQ(printable("\xff\x7f"), "\\xff\\x7f");
  EXPECT_EQ(printable(std::string(300, 'a'), 4), "aaaa...(300 bytes)");
}

TEST(Security, StrangersAreRejectedAndLoggedOnceWhileTheGenuineCallCompletes) {
  Controller ctl;
  auto pool = ctl.add_pool(pool_spec("guarded", 1));
  auto group = ctl.create_group("guarded", "actor", "echo");
  ::testing::internal::CaptureStderr();
  DataProto sleep;
  sleep.meta()["sleep_ms"] = 200;
  Future genuine = group.call("sleep", sleep);

  zmq::context_t context(1);
  // Wrong secret, forging results for every plausible call id, twice (the second is not logged again).
  zmq::socket_t a = intruder(context, pool->endpoint());
  Link stranger("an-attackers-guess-0123456789abcdefgh", "pool:guarded", 0);
  for (int id = 0; id < 4; ++id) stranger.send(a, "", kControllerEnd, {"result", {{"call_id", id}}, std::nullopt});
  // Oversized: three frames of 100 kB against the 256 KiB limit; and one frame over it, which ZeroMQ drops.
  zmq::socket_t b = intruder(context, pool->endpoint());
  const std::string chunk(100000, 'x');
  send_raw(b, {chunk, chunk, chunk});
  zmq::socket_t c = intruder(context, pool->endpoint());
  send_raw(c, {std::string(300000, 'y')});
  // The job's key (a leaked secret, or a confused process of the same job): a rank this pool does not
  // have, a replay of rank 0's first message, and a second joiner for the taken rank 0.
  zmq::socket_t d = intruder(context, pool->endpoint());
  Link unknown(pool->token(), "pool:guarded", 7);
  unknown.send(d, "", kControllerEnd, hello(7));
  Link replayed(pool->token(), "pool:guarded", 0);
  replayed.send(d, "", kControllerEnd, hello(0));  // sequence number 1: rank 0 is far past it
  // The second joiner speaks from an identity crafted to forge a log line: it must come out escaped.
  zmq::socket_t e(context, zmq::socket_type::dealer);
  e.set(zmq::sockopt::linger, 0);
  e.set(zmq::sockopt::routing_id, "evil\nERROR forged");
  e.connect(pool->endpoint());
  Link second(pool->token(), "pool:guarded", 0);
  zmq::socket_t sink(context, zmq::socket_type::pub);  // moves its sequence number past rank 0's
  sink.set(zmq::sockopt::linger, 0);
  sink.bind("inproc://sink");
  for (int i = 0; i < 10000; ++i) second.send(sink, "", kControllerEnd, {"heartbeat", {}, std::nullopt});
  second.send(e, "", kControllerEnd, hello(0));

  wait_for_rejections(*pool, 4 + 1 + 3);
  EXPECT_EQ(longs(genuine.get().tensor("pid")), (std::vector<int64_t>{pool->pids()[0]}));
  EXPECT_EQ(longs(group.call("pid").get().tensor("pid")), (std::vector<int64_t>{pool->pids()[0]}))
      << "the run goes on after the attack";
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(pool->rejected_messages(), 8u) << log;
  EXPECT_FALSE(pool->failed());
  for (const char* what : {"not authenticated", "oversized message", "rank 7 is not a rank of this pool",
                           "replayed message", "a second joiner is refused"})
    EXPECT_NE(log.find(what), std::string::npos) << what << " in:\n" << log;
  size_t forged_lines = 0;
  for (size_t at = log.find("not authenticated"); at != std::string::npos; at = log.find("not authenticated", at + 1))
    ++forged_lines;
  EXPECT_EQ(forged_lines, 1u) << "one line per peer and kind of rejection:\n" << log;
  EXPECT_EQ(log.find("\nERROR forged"), std::string::npos) << "peer text is escaped:\n" << log;
  EXPECT_NE(log.find("evil\\nERROR forged"), std::string::npos) << log;
}

TEST(Security, LaunchSecretIsRequiredAndWeakOnesAreRefused) {
  std::map<std::string, std::string> env = {{"RANK", "1"},           {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "1"},
                                            {"MASTER_ADDR", "127.0.0.1"}, {"MASTER_PORT", "29400"},
                                            {"TORCHELASTIC_RUN_ID", "run-7"}, {"SLURM_JOB_ID", "812"}};
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("HF_JOB_TOKEN_FILE"), std::string::npos)
      << "guessable launcher ids are not a secret";
  env["HF_JOB_TOKEN"] = "short";
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("at least 32"), std::string::npos);
  env["HF_JOB_TOKEN"] = "2f6c0e3d9a7b41c82f6c0e3d9a7b41c8";  // the example once printed in docs/cluster.md
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("well-known example"), std::string::npos);
  env["HF_JOB_TOKEN"] = std::string(40, 'a');
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("distinct characters"), std::string::npos);

  hybridflow::testing::TempDir dir;
  const std::string file = dir.file("secret");
  write_file_atomic(file, kSecret + "\n");
  env.erase("HF_JOB_TOKEN");
  env["HF_JOB_TOKEN_FILE"] = file;
  ::chmod(file.c_str(), 0644);
  EXPECT_NE(error_of([&] { launch_settings_from(env); }).find("chmod 600"), std::string::npos);
  ::chmod(file.c_str(), 0600);
  const auto s = launch_settings_from(env);
  EXPECT_EQ(s.token, kSecret) << "read from the file, trailing newline dropped";
  EXPECT_EQ(s.token_source, "HF_JOB_TOKEN_FILE=" + file);
  // A pool's own token for external workers is held to the same rule.
  auto spec = pool_spec("weak", 1);
  spec.spawn_workers = false;
  spec.token = "guessable";
  EXPECT_NE(error_of([&] { ProcessPool::start(spec); }).find("at least 32"), std::string::npos);
}

TEST(Security, PoolEnvironmentOfALaunchIsLimitedToKnownKeys) {
  for (const char* key : {"OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES", "OPENBLAS_NUM_THREADS"})
    EXPECT_TRUE(pool_env_key_allowed(key)) << key;
  for (const char* key : {"PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "NCCL_NET_PLUGIN", "HF_WORKER_ENDPOINT"})
    EXPECT_FALSE(pool_env_key_allowed(key)) << key;
}

TEST(Security, LaunchCompletesWhileStrangersAndUnknownRanksKnock) {
  hybridflow::testing::TempDir dir;
  const int port = free_tcp_port();
  Job job;
  for (int rank = 0; rank < 3; ++rank)
    job.pids.push_back(spawn_with({self_exe()}, {{"RANK", std::to_string(rank)}, {"WORLD_SIZE", "3"},
                                                 {"LOCAL_RANK", std::to_string(rank)}, {"MASTER_ADDR", "127.0.0.1"},
                                                 {"MASTER_PORT", std::to_string(port)}, {"HF_JOB_TOKEN", kSecret},
                                                 {"HF_TEST_LAUNCH_JOB", "pools"}, {"HF_TEST_POOL_SIZES", "1,1"},
                                                 {"HF_TEST_RESULT", dir.file("result.json")},
                                                 {"OMP_NUM_THREADS", "1"}}));
  // Knocks until the job is over: another job's secret, and rank 5 of a world of 3 with the right one.
  std::atomic<bool> done{false};
  std::thread knocker([&] {
    zmq::context_t context(1);
    zmq::socket_t s(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    s.set(zmq::sockopt::sndtimeo, 100);  // never blocks past the job's end while not connected
    s.connect("tcp://127.0.0.1:" + std::to_string(port));
    Link stranger("another-jobs-secret-0a1b2c3d4e5f6789", "launch", 1), unknown(kSecret, "launch", 5);
    const transport_detail::Message join{"join", {{"world_size", 3}, {"host", "x"}}, std::nullopt};
    while (!done) {
      stranger.send(s, "", kControllerEnd, join);
      unknown.send(s, "", kControllerEnd, join);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  job.wait_all(30);
  done = true;
  knocker.join();
  auto result = read_result(dir.file("result.json"));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(job.code(r), 0) << "rank " << r << "; result " << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  std::vector<int64_t> z;
  for (int i = 0; i < 6; ++i) z.push_back(2 * i + 1);
  EXPECT_EQ(result["z"].get<std::vector<int64_t>>(), z);
  EXPECT_GT(result.value("rejected", 0), 0) << "the knocks were counted as rejected";
}

// Ranks of one process answer a batched call with one merged reply; a rank holding the job's key may answer
// only for the ranks the call reached through it. Four ranks played by this test, two "processes" of two.
TEST(Security, MergedReplyAnswersOnlyForItsOwnBatch) {
  auto spec = pool_spec("merged", 4);
  spec.spawn_workers = false;
  spec.token = kSecret;
  spec.bind_port = free_tcp_port();
  const std::string endpoint = "tcp://127.0.0.1:" + std::to_string(spec.bind_port);
  zmq::context_t context(1);
  std::vector<zmq::socket_t> sockets;
  std::vector<std::unique_ptr<Link>> links;
  for (int rank = 0; rank < 4; ++rank) {
    sockets.push_back(intruder(context, endpoint));
    links.push_back(std::make_unique<Link>(kSecret, "pool:merged", rank));
    links.back()->send(sockets.back(), "", kControllerEnd,
                       {"hello", {{"rank", rank}, {"pid", rank < 2 ? 424242 : 434343}, {"host", "h"}, {"batches", true}},
                        std::nullopt});
  }
  auto pool = ProcessPool::start(spec);
  std::promise<std::vector<DataProto>> done;
  auto result = done.get_future();
  pool->submit("actor", "noop", std::vector<DataProto>(4), [&](std::vector<DataProto>&& out) { done.set_value(out); },
               [&](std::exception_ptr e) { done.set_exception(e); });
  // The call reaches each process once, through its lowest rank, with the ranks it is for.
  auto batch_for = [&](int rank) {
    while (true) {
      auto received = hybridflow::transport_testing::next(*links[rank], sockets[rank], false);
      if (!received) return nlohmann::json();
      if (received->message && received->message->kind == "call") return received->message->meta;
    }
  };
  const nlohmann::json first = batch_for(0), second = batch_for(2);
  ASSERT_EQ(first.at("ranks"), nlohmann::json::parse("[[0, 0], [1, 0]]")) << first.dump();
  ASSERT_EQ(second.at("ranks"), nlohmann::json::parse("[[2, 0], [3, 0]]")) << second.dump();
  auto merged = [&](int a, int b) {
    nlohmann::json parts = nlohmann::json::array();
    for (int r : {a, b}) parts.push_back({{"rank", r}, {"kind", "result"}, {"meta", nlohmann::json::object()}, {"data", "empty"}});
    return transport_detail::Message{"results", {{"call_id", first.at("call_id")}, {"parts", parts}}, std::nullopt};
  };
  links[2]->send(sockets[2], "", kControllerEnd, merged(0, 1));  // answers for the other process's ranks
  wait_for_rejections(*pool, 1);
  EXPECT_EQ(pool->rejected_messages(), 1u);
  EXPECT_EQ(result.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  links[0]->send(sockets[0], "", kControllerEnd, merged(0, 1));
  links[2]->send(sockets[2], "", kControllerEnd, merged(2, 3));
  ASSERT_EQ(result.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_EQ(result.get().size(), 4u);
  EXPECT_EQ(pool->rejected_messages(), 1u);
  pool->shutdown();
}
