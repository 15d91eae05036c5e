// What a config costs, computed before the model exists: the shapes it implies must be the built model's, and
// an absurd or too large config must fail naming its keys before any module is allocated.
#include "hybridflow/model/model_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <fstream>

#include "hybridflow/core/error.h"
#include "hybridflow/model/transformer.h"
#include "support/error_of.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;
using hybridflow::testing::error_of;

TEST(ModelSize, ExpectedShapesAreTheBuiltModelsForEveryPresetAndHead) {
  at::set_num_threads(1);
  for (const char* preset : {"tiny", "qwen2-tiny", "qwen3-tiny", "mistral-tiny"}) {
    for (HeadKind head : {HeadKind::kLanguageModel, HeadKind::kValue}) {
      ModelConfig config = preset_model_config(preset, 50);
      config.num_hidden_layers = 2;
      const bool value_head = head == HeadKind::kValue;
      CausalLM model(config, head);
      std::map<std::string, std::vector<int64_t>> built;
      double parameters = 0;
      for (const auto& item : model->named_parameters(/*recurse=*/true)) {
        built[item.key()] = item.value().sizes().vec();
        parameters += static_cast<double>(item.value().numel());
      }
      const std::string where = std::string(preset) + (value_head ? " value head" : " lm head");
      EXPECT_EQ(expected_weight_shapes(config, value_head), built) << where;
      EXPECT_EQ(model_size(config, value_head).parameters(), parameters) << where;
      EXPECT_EQ(expected_weight_count(config, value_head), static_cast<double>(built.size())) << where;
      if (!value_head) {
        EXPECT_EQ(static_cast<double>(config.num_parameters()), parameters) << where;
      }
    }
  }
}

TEST(ModelSize, AbsurdLayerCountFailsBeforeBuildingNamingTheKey) {
  // 10^8 layers of the tiny preset: ~80 TB of float32. Without the check the constructor would start
  // allocating (and initialising) layer after layer until the machine ran out of memory.
  ModelConfig config = preset_model_config("tiny", 50);
  config.num_hidden_layers = 100000000;
  std::string msg = error_of([&] { CausalLM model(config); });
  EXPECT_THAT(msg, HasSubstr("model config: the model has "));
  EXPECT_THAT(msg, HasSubstr("available ("));
  EXPECT_THAT(msg, HasSubstr("from num_hidden_layers (100000000) x hidden_size (128) x intermediate_size (344)"));
  // Same for a huge vocabulary (`hybridflow init --vocab-multiple` reaches this), named by its keys.
  ModelConfig wide = preset_model_config("tiny", 50);
  wide.vocab_size = int64_t{1} << 40;
  msg = error_of([&] { CausalLM model(wide, HeadKind::kValue); });
  EXPECT_THAT(msg, HasSubstr("from vocab_size (1099511627776) x hidden_size (128)"));
}

TEST(ModelSize, SizesThatOverflowInt64AreRejectedByValidate) {
  ModelConfig config = preset_model_config("tiny", 50);
  config.hidden_size = 1000000000;
  config.intermediate_size = 1000000000;
  std::string msg = error_of([&] { config.validate(); });
  EXPECT_THAT(msg, HasSubstr("hidden_size (1000000000)"));
  EXPECT_THAT(msg, HasSubstr("which no machine holds"));
}

double vm_size_bytes() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("VmSize:", 0) == 0) return std::stod(line.substr(7)) * 1024.0;
  return 0;
}

TEST(ModelSize, APerProcessAddressSpaceLimitIsHonoured) {
  at::set_num_threads(1);
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_AS, &saved), 0);
  const double headroom = 64.0 * (1 << 20);
  const rlim_t limit = static_cast<rlim_t>(vm_size_bytes() + headroom);
  if (saved.rlim_max != RLIM_INFINITY && saved.rlim_max < limit) GTEST_SKIP() << "hard RLIMIT_AS already lower";
  rlimit lowered = saved;
  lowered.rlim_cur = limit;
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &lowered), 0);
  AvailableMemory available = available_memory();
  // The base preset with a 100k vocabulary: ~100 M parameters, 400 MB, more than the 64 MiB left.
  ModelConfig config = preset_model_config("base", 100000);
  std::string msg = error_of([&] { CausalLM model(config); });
  ASSERT_EQ(::setrlimit(RLIMIT_AS, &saved), 0);
  EXPECT_LE(available.bytes, headroom);
  EXPECT_THAT(available.source, HasSubstr("RLIMIT_AS"));
  EXPECT_THAT(msg, HasSubstr("RLIMIT_AS (ulimit -v) headroom of this process"));
  EXPECT_THAT(msg, HasSubstr("vocab_size (100000) x hidden_size (512)"));
}

TEST(ModelSize, HumanBytes) {
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(human_bytes(1.5 * (1 << 30)), "1.5 GiB");
  EXPECT_EQ(human_bytes(80e12), "73 TiB");
}

}  // namespace
}  // namespace hybridflow
