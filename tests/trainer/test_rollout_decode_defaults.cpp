// The rollout's decode settings from the configuration to the engine's GenerationConfig, as a worker resolves
// them on its device (workers/rollout_generation.h): actor_rollout_ref.rollout.enforce_eager and
// readback_interval unset give CUDA graphs and reads every kCudaReadbackInterval steps on a CUDA device, and
// eager steps read one at a time on the CPU (as before they defaulted to null); set, they say what they say,
// and enforce_eager: false makes the graphs required (refused by name where they cannot replay on a GPU).
// Runs on the CPU: only the device's kind is asked, no CUDA call is made.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridflow/core/error.h"
#include "hybridflow/trainer/rl_trainer.h"
#include "hybridflow/workers/rollout_generation.h"
#include "support/tiny_model.h"
#include "trainer/role_spec_builders.h"

namespace hybridflow {
namespace {

// The rollout spec of a configuration with `overrides`, after its trip to the worker (JSON).
RolloutSpec rollout_spec(const std::vector<std::string>& overrides) {
  const Config config = load_rl_config("", overrides);
  RoleFacts f;
  f.seed = 1;
  f.batch_prompts = 8;
  f.adv_estimator = "gae";
  f.actor.key = "actor_rollout_ref.num_processes";
  f.rollout.key = "actor_rollout_ref.rollout.num_processes";
  ModelSpec model = model_spec_from_config(ConfigReader(config));
  model.vocab_size = 41;
  model.eos_token_id = 2;
  model.pad_token_id = 0;
  return nlohmann::json(build_role_specs(config, f, model).rollout).get<RolloutSpec>();
}

GenerationConfig resolved(const RolloutSpec& spec, const torch::Device& device) {
  ModelSpec model_spec;
  model_spec.vocab_size = 41;
  const ModelConfig model = testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48});
  return rollout_generation_config(spec, model_spec, model, DataProto(), 0, device);
}

const torch::Device kCuda(torch::kCUDA, 0);
const torch::Device kCpu(torch::kCPU);

TEST(RolloutDecodeDefaults, UnsetMeansGraphsAndChunksOnCudaAndTheOldStepsOnTheCpu) {
  const RolloutSpec spec = rollout_spec({});
  EXPECT_FALSE(spec.cuda_graphs.has_value());
  EXPECT_FALSE(spec.readback_interval.has_value());
  const GenerationConfig cuda = resolved(spec, kCuda);
  EXPECT_TRUE(cuda.cuda_graphs);
  EXPECT_FALSE(cuda.require_cuda_graphs);  // where graphs do not apply, eager steps without a message
  EXPECT_EQ(cuda.readback_interval, kCudaReadbackInterval);
  EXPECT_EQ(kCudaReadbackInterval, 8);
  // The CPU: GenerationConfig's own defaults, so every CPU result stays what it was.
  const GenerationConfig cpu = resolved(spec, kCpu);
  const GenerationConfig engine_defaults;
  EXPECT_EQ(cpu.cuda_graphs, engine_defaults.cuda_graphs);
  EXPECT_FALSE(cpu.cuda_graphs);
  EXPECT_FALSE(cpu.require_cuda_graphs);
  EXPECT_EQ(cpu.readback_interval, engine_defaults.readback_interval);
  EXPECT_EQ(cpu.readback_interval, 1);
}

TEST(RolloutDecodeDefaults, SetKeysHoldOnEveryDevice) {
  const RolloutSpec eager = rollout_spec({"actor_rollout_ref.rollout.enforce_eager=true",
                                          "actor_rollout_ref.rollout.readback_interval=1"});
  const RolloutSpec graphs = rollout_spec({"actor_rollout_ref.rollout.enforce_eager=false",
                                           "actor_rollout_ref.rollout.readback_interval=3"});
  for (const torch::Device& device : {kCuda, kCpu}) {
    SCOPED_TRACE(device.str());
    const GenerationConfig e = resolved(eager, device);
    EXPECT_FALSE(e.cuda_graphs);
    EXPECT_FALSE(e.require_cuda_graphs);
    EXPECT_EQ(e.readback_interval, 1);
    // Asked for by name: required, so that a GPU rollout they cannot cover fails naming the key (the CPU
    // decodes eagerly all the same: engine/decode_graph_obstacles.h).
    const GenerationConfig g = resolved(graphs, device);
    EXPECT_TRUE(g.cuda_graphs);
    EXPECT_TRUE(g.require_cuda_graphs);
    EXPECT_EQ(g.readback_interval, 3);
  }
  // Only the graphs set: the interval still follows the device.
  const RolloutSpec graphs_only = rollout_spec({"actor_rollout_ref.rollout.enforce_eager=false"});
  EXPECT_EQ(resolved(graphs_only, kCuda).readback_interval, kCudaReadbackInterval);
  EXPECT_EQ(resolved(graphs_only, kCpu).readback_interval, 1);
}

// Combinations graphs do not cover are configured as before: unset they fall back to eager steps in the
// engine; only a GPU rollout with enforce_eager: false refuses them.
TEST(RolloutDecodeDefaults, CombinationsGraphsDoNotCoverStillConfigure) {
  const RolloutSpec slots = rollout_spec({"actor_rollout_ref.rollout.kv_cache=slots"});
  EXPECT_FALSE(slots.paged_kv_cache);
  EXPECT_TRUE(resolved(slots, kCuda).cuda_graphs);  // the engine decodes the slots eagerly
  EXPECT_FALSE(resolved(slots, kCuda).require_cuda_graphs);
  const RolloutSpec invariant = rollout_spec({"actor_rollout_ref.rollout.batch_invariant=true"});
  EXPECT_FALSE(resolved(invariant, kCuda).require_cuda_graphs);
}

// verl's rollout.ignore_eos: no eos id reaches the engine, so every response runs to response_length.
TEST(RolloutDecodeDefaults, IgnoreEosLeavesTheEngineNoStopIds) {
  ModelSpec model_spec;
  model_spec.vocab_size = 41;
  model_spec.eos_token_ids = std::vector<int64_t>{2, 5};  // a model that stops on two ids (Llama 3 instruct's kind)
  const ModelConfig model = testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48});
  auto eos_of = [&](const RolloutSpec& spec, const torch::Device& device) {
    return rollout_generation_config(spec, model_spec, model, DataProto(), 0, device).eos_token_ids;
  };
  EXPECT_EQ(eos_of(rollout_spec({}), kCpu), (std::vector<int64_t>{2, 5}));
  const RolloutSpec ignoring = rollout_spec({"actor_rollout_ref.rollout.ignore_eos=true"});
  EXPECT_TRUE(ignoring.ignore_eos);
  EXPECT_TRUE(eos_of(ignoring, kCpu).empty());
  EXPECT_TRUE(eos_of(ignoring, kCuda).empty());
}

TEST(RolloutDecodeDefaults, ABadIntervalNamesItsKey) {
  try {
    rollout_spec({"actor_rollout_ref.rollout.readback_interval=0"});
    FAIL() << "readback_interval 0 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("actor_rollout_ref.rollout.readback_interval"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace hybridflow
