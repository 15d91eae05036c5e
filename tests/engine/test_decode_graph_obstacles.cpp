// What keeps decode steps from replaying as CUDA graphs (engine/decode_graph_obstacles.h), checked on the CPU:
// each obstacle is found and names the key that sets it, the model-state obstacles agree with
// CausalLM::decodes_on_device(), and graphs asked for by name on the CPU still decode eagerly (the CPU runs a
// GPU configuration unchanged). The refusal itself needs a CUDA model: test_cuda_parity checks it on a GPU.
#include "hybridflow/engine/decode_graph_obstacles.h"

#include <gtest/gtest.h>

#include <string>

#include "hybridflow/model/batch_invariant.h"
#include "support/tiny_model.h"

namespace hybridflow {
namespace {

class DecodeGraphObstacles : public ::testing::Test {
 protected:
  void SetUp() override {
    at::set_num_threads(1);
    torch::manual_seed(3);
    model = CausalLM(testing::tiny_model_config({.vocab_size = 41, .hidden_size = 32, .intermediate_size = 48},
                                                "qwen2-tiny"));
  }
  // The obstacle, with gradients off as inside generate().
  std::string obstacle(const GenerationConfig& cfg) {
    torch::NoGradGuard no_grad;
    return decode_graph_obstacle(model, cfg);
  }
  CausalLM model{nullptr};
};

void expect_names(const std::string& obstacle, const std::string& key) {
  EXPECT_NE(obstacle.find(key), std::string::npos) << "expected '" << key << "' in: " << obstacle;
}

TEST_F(DecodeGraphObstacles, NoneForADenseModelOnThePagedContinuousPath) {
  GenerationConfig cfg;
  cfg.cuda_graphs = true;
  EXPECT_EQ(obstacle(cfg), "");
  EXPECT_TRUE(model->decodes_on_device());
}

TEST_F(DecodeGraphObstacles, EachGenerationSettingIsNamed) {
  GenerationConfig slots;
  slots.paged_kv_cache = false;
  expect_names(obstacle(slots), "kv_cache: slots");
  GenerationConfig stat;
  stat.continuous_batching = false;
  expect_names(obstacle(stat), "static-batch");
  GenerationConfig refreshed;
  refreshed.refresh_weights = [] { return int64_t{0}; };
  expect_names(obstacle(refreshed), "partial_rollout or stream_groups");
  GenerationConfig routed;
  routed.record_routing = true;
  expect_names(obstacle(routed), "router_replay.mode R3");
}

// The model's own state (adapters, the batch-invariant kernels): found where decodes_on_device() says no.
TEST_F(DecodeGraphObstacles, TheModelsStateAgreesWithDecodesOnDevice) {
  const GenerationConfig cfg;
  LoraConfig lora;
  lora.rank = 2;
  model->add_lora(lora);
  expect_names(obstacle(cfg), "lora_merge: false");
  EXPECT_FALSE(model->decodes_on_device());
  model->merge_lora();  // what rollout.lora_merge: true does around a rollout
  EXPECT_EQ(obstacle(cfg), "");
  EXPECT_TRUE(model->decodes_on_device());
  model->unmerge_lora();
  model->set_lora_enabled(false);  // the reference policy: the base model
  EXPECT_EQ(obstacle(cfg), "");
  model->set_lora_enabled(true);
  model->merge_lora();
  {
    BatchInvariantGuard batch_invariant;
    torch::NoGradGuard no_grad;
    expect_names(decode_graph_obstacle(model, cfg), "rollout.batch_invariant");
    EXPECT_FALSE(model->decodes_on_device());
  }
  EXPECT_EQ(obstacle(cfg), "");
}

// Graphs asked for by name where they cannot replay (the slots cache, a static batch): on the CPU generation
// goes on eagerly, with the eager tokens and log-probs, and no path or model state is refused.
TEST_F(DecodeGraphObstacles, RequiredGraphsOnTheCpuDecodeEagerly) {
  const std::vector<std::vector<int64_t>> prompts = {{5, 9, 2, 30, 7}, {1, 12}};
  for (const bool paged : {true, false}) {
    GenerationConfig cfg;
    cfg.max_new_tokens = 5;
    cfg.n = 2;
    cfg.seed = 4;
    cfg.paged_kv_cache = paged;
    const GenerationOutput eager = generate(model, prompts, cfg);
    cfg.cuda_graphs = cfg.require_cuda_graphs = true;
    EXPECT_NO_THROW(check_required_decode_graphs(model, cfg));
    EXPECT_NO_THROW(check_required_decode_graphs(model, cfg, "a path that never replays graphs"));
    const GenerationOutput asked = generate(model, prompts, cfg);
    EXPECT_TRUE(torch::equal(asked.responses, eager.responses)) << "paged " << paged;
    EXPECT_TRUE(torch::equal(asked.log_probs, eager.log_probs)) << "paged " << paged;
    EXPECT_EQ(asked.graph_steps, 0);
  }
}

}  // namespace
}  // namespace hybridflow
