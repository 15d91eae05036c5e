// Data-parallel training across "hosts": three network namespaces on a bridge, torchrun's environment,
// the controller on host a and a 2-rank actor pool on hosts b and c. The ranks must find the store in the
// controller and connect Gloo to each other over their 10.x addresses (a loopback-bound Gloo could not),
// end bitwise equal, and match the same update run in the controller process. Needs root; skipped where
// `ip netns add` fails.
#include "hybridflow/workers/rl_workers.h"

// Registered before launch_test_job.h's static initialisers turn launched ranks into workers.
static const bool kRegisteredRlWorkers = (hybridflow::register_rl_workers(), true);

#include "runtime/launch_test_job.h"

#include "hybridflow/workers/rl_batch.h"
#include "support/netns_hosts.h"

namespace {

nlohmann::json actor_config(int64_t mini_batch_rows) {
  return {{"model",
           {{"preset", "tiny"}, {"vocab_size", 12}, {"hidden_size", 32}, {"num_hidden_layers", 1},
            {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"intermediate_size", 64}, {"init_seed", 3},
            {"eos_token_id", 2}, {"pad_token_id", 0}}},
          {"actor", {{"lr", 1e-2}, {"mini_batch_rows", mini_batch_rows}, {"micro_batch_rows", 2}, {"epochs", 2},
                     {"shuffle", false}}},
          {"rollout", {{"response_length", 5}, {"n", 2}, {"seed", 11}}}};
}

// The controller rank: the same update on the 2-rank pool and on an actor in this process.
void run_dp_job(nlohmann::json& result) {
  WorkerHost local;
  WorkerContext ctx;
  ctx.role = "actor";
  ctx.config = actor_config(8);
  local.create(kActorRolloutRefWorkerType, ctx);
  DataProto batch = local.call("actor", "generate_sequences", make_prompt_batch({{1, 5, 6, 7}, {1, 8}, {1, 9, 4}, {1, 3}}, 0));
  batch.update(local.call("actor", "compute_log_prob", batch));
  torch::manual_seed(5);
  batch.set_tensor("advantages", torch::randn(batch.tensor("response_mask").sizes()) *
                                     batch.tensor("response_mask").to(torch::kFloat));

  Controller ctl;
  ctl.add_pools({pool_spec("dp", 2)});
  WorkerGroup dp = ctl.create_group("dp", "actor", kActorRolloutRefWorkerType, {}, actor_config(4));
  Future update = dp.call("update_actor", batch);
  result["comm"] = update.get().meta().at("comm");
  local.call("actor", "update_actor", batch);
  Future params = dp.call("flat_parameters");
  params.get();
  const auto single = local.call("actor", "flat_parameters", DataProto()).tensor("parameters");
  const auto& p0 = params.per_rank().at(0).tensor("parameters");
  const auto& p1 = params.per_rank().at(1).tensor("parameters");
  result["replicas_equal"] = torch::equal(p0, p1);
  result["max_diff_to_single"] = (p0 - single).abs().max().item<double>();
  result["params"] = single.numel();
}

bool run_dp_job_if_requested() {
  if (!std::getenv("HF_TEST_DP_JOB")) return false;
  nlohmann::json result = nlohmann::json::object();
  int code = 0;
  try {
    run_dp_job(result);
  } catch (const std::exception& e) {
    result["error"] = e.what();
    code = 1;
  }
  write_file_atomic(env_or("HF_TEST_RESULT", ""), result.dump());
  std::exit(code);  // not _Exit: the launch's exit hook releases the ranks no pool used
}

}  // namespace

static const bool kRanDpJob = run_dp_job_if_requested();

TEST(DataParallelMultiHost, RanksOnTwoHostsTrainAsOneProcess) {
  const std::string tag = "hfdp" + std::to_string(::getpid());
  const std::string sw = tag + "-sw";
  const std::vector<std::string> host = {tag + "-a", tag + "-b", tag + "-c"};
  hybridflow::testing::NetnsHosts hosts;
  if (!hosts.add(sw)) GTEST_SKIP() << "`ip netns add` is not permitted here (needs root and iproute2)";
  std::vector<std::string> addr;
  ASSERT_NO_FATAL_FAILURE(hosts.wire(sw, host, &addr));
  hybridflow::testing::TempDir dir;
  Job job;
  for (int rank = 0; rank < 3; ++rank) {
    job.pids.push_back(spawn_with({"ip", "netns", "exec", host[rank], self_exe()},
                                  {{"RANK", std::to_string(rank)},
                                   {"WORLD_SIZE", "3"},
                                   {"LOCAL_RANK", "0"},
                                   {"LOCAL_WORLD_SIZE", "1"},
                                   {"MASTER_ADDR", addr[0]},
                                   {"MASTER_PORT", "29500"},
                                   {"HF_JOB_TOKEN", tag + "-secret-4f1c9e27b6a0d385e71c"},
                                   {"HF_TEST_DP_JOB", "1"},
                                   {"HF_TEST_RESULT", dir.file("result.json")},
                                   {"HF_WORKER_CONNECT_TIMEOUT_S", "20"},
                                   {"OMP_NUM_THREADS", "1"},
                                   {"OMP_WAIT_POLICY", "passive"}}));
  }
  job.wait_all(40);
  auto result = read_result(dir.file("result.json"));
  for (int r = 0; r < 3; ++r) EXPECT_EQ(job.code(r), 0) << "rank " << r << "; result " << result.dump();
  ASSERT_FALSE(result.contains("error")) << result.dump();
  EXPECT_TRUE(result.at("replicas_equal").get<bool>()) << result.dump();
  EXPECT_LT(result.at("max_diff_to_single").get<double>(), 1e-5) << result.dump();
  const int64_t params = result.at("params").get<int64_t>();
  EXPECT_EQ(result["comm"]["gradient"]["all_reduce"]["bytes"].get<int64_t>(), 2 * (params + 2) * 4)
      << "2 epochs x 1 mini-batch: " << result.dump();
}
