// `hybridflow lora merge` as a user runs it: the merged directory is a plain model computing base + adapter,
// and an adapter that does not fit its base, or asks for a PEFT option hybridflow lacks, is an error naming
// the file. (tests/model/test_lora.cpp checks the merged directory against PEFT's merge_and_unload.) And a
// smoke run of `hybridflow bench lora` whose byte counts follow from the parameter counts.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include "hybridflow/core/fs.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace {

using hybridflow::testing::CommandResult;
using hybridflow::testing::run_hybridflow;

torch::Tensor cli_lora_logits(hybridflow::CausalLM& model) {
  torch::NoGradGuard no_grad;
  model->eval();
  auto ids = torch::tensor({{1, 5, 7, 9, 11, 3}, {0, 0, 1, 4, 6, 8}}, torch::kInt64);
  auto mask = torch::tensor({{1, 1, 1, 1, 1, 1}, {0, 0, 1, 1, 1, 1}}, torch::kInt64);
  return model->forward(ids, mask).logits;
}

// Writes DIR/adapter: an all-linear rank-4 adapter on the model in DIR/base with random non-zero A and B (a
// fresh B is zeros, which would make the merge a copy), and returns base + adapter's logits.
torch::Tensor write_random_adapter(const hybridflow::testing::TempDir& dir) {
  hybridflow::Pretrained base = hybridflow::load_pretrained(dir.file("base"));
  hybridflow::LoraConfig lora;
  lora.rank = 4;
  lora.alpha = 12;
  base.model->add_lora(lora, /*seed=*/3);
  torch::manual_seed(4);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : base.model->named_parameters())
      if (hybridflow::is_lora_parameter_name(item.key()))
        item.value().copy_(torch::randn(item.value().sizes()) / std::sqrt(static_cast<double>(item.value().size(1))));
  }
  hybridflow::save_lora_adapter(dir.file("adapter"), base.model, dir.file("base"));
  return cli_lora_logits(base.model);
}

TEST(CliLora, MergeWritesAPlainModelComputingBasePlusAdapter) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("base")).exit_code, 0);
  const torch::Tensor adapted = write_random_adapter(dir);
  CommandResult r = run_hybridflow("lora merge --base " + dir.file("base") + " --adapter " + dir.file("adapter") +
                                   " --out " + dir.file("merged"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  hybridflow::Pretrained merged = hybridflow::load_pretrained(dir.file("merged"));
  EXPECT_FALSE(merged.model->has_lora());
  const torch::Tensor logits = cli_lora_logits(merged.model);
  EXPECT_LT((logits - adapted).abs().max().item<double>(), 1e-5 * std::max(1.0, adapted.abs().max().item<double>()));
  hybridflow::Pretrained base = hybridflow::load_pretrained(dir.file("base"));
  EXPECT_GT((logits - cli_lora_logits(base.model)).abs().max().item<double>(), 1e-2) << "the adapter must matter";
  EXPECT_EQ(hybridflow::read_file(dir.file("merged/config.json")), hybridflow::read_file(dir.file("base/config.json")));
}

TEST(CliLora, MergeNamesTheFileOfAnAdapterThatDoesNotFit) {
  hybridflow::testing::TempDir dir;
  ASSERT_EQ(run_hybridflow("init --preset tiny --task addition --seed 3 --out " + dir.file("base")).exit_code, 0);
  write_random_adapter(dir);
  // Another base: wider projections, so the adapter's tensors have the wrong shapes.
  ASSERT_EQ(run_hybridflow("init --preset qwen3-tiny --task addition --out " + dir.file("other")).exit_code, 0);
  CommandResult other = run_hybridflow("lora merge --base " + dir.file("other") + " --adapter " + dir.file("adapter") +
                                       " --out " + dir.file("merged"));
  EXPECT_NE(other.exit_code, 0);
  EXPECT_NE(other.output.find(dir.file("adapter") + "/adapter_"), std::string::npos) << other.output;
  EXPECT_FALSE(hybridflow::file_exists(dir.file("merged/model.safetensors")));

  // PEFT options hybridflow does not implement: the error names the file and the key.
  const std::string config_file = dir.file("adapter/adapter_config.json");
  const auto config = nlohmann::json::parse(hybridflow::read_file(config_file));
  for (const auto& [key, value] : {std::pair<std::string, nlohmann::json>{"use_dora", true},
                                   {"use_rslora", true}, {"bias", "lora_only"}}) {
    auto changed = config;
    changed[key] = value;
    hybridflow::write_file_atomic(config_file, changed.dump());
    CommandResult r = run_hybridflow("lora merge --base " + dir.file("base") + " --adapter " + dir.file("adapter") +
                                     " --out " + dir.file("merged"));
    EXPECT_NE(r.exit_code, 0) << key;
    EXPECT_NE(r.output.find(config_file), std::string::npos) << r.output;
    EXPECT_NE(r.output.find(key), std::string::npos) << r.output;
  }
  hybridflow::write_file_atomic(config_file, config.dump());

  CommandResult no_adapter = run_hybridflow("lora merge --base " + dir.file("base") + " --adapter " + dir.file("base") +
                                            " --out " + dir.file("merged"));
  EXPECT_NE(no_adapter.exit_code, 0);
  EXPECT_NE(no_adapter.output.find("adapter_config.json"), std::string::npos) << no_adapter.output;
  CommandResult in_place = run_hybridflow("lora merge --base " + dir.file("base") + " --adapter " +
                                          dir.file("adapter") + " --out " + dir.file("base"));
  EXPECT_NE(in_place.exit_code, 0);
  EXPECT_NE(in_place.output.find("--out"), std::string::npos) << in_place.output;
  EXPECT_NE(run_hybridflow("lora merge --base " + dir.file("base")).exit_code, 0) << "--adapter and --out are required";
}

TEST(CliLora, BenchLoraCountsOnlyTheAdaptersGradientsAndOptimizerState) {
  CommandResult r = run_hybridflow("bench lora --preset tiny --vocab 64 --lora-ranks 2,8 --steps 1 --batch 2 "
                                   "--prompt-length 4 --response-length 4 --json");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  std::vector<nlohmann::json> lines;
  std::istringstream in(r.output);
  for (std::string line; std::getline(in, line);)
    if (!line.empty() && line.front() == '{') lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 3u) << r.output;
  const auto& full = lines[0];
  EXPECT_EQ(full["training"], "full");
  EXPECT_EQ(full["trainable"], full["parameters"]);
  for (const auto& m : lines) {
    // fp32: 4 bytes a gradient, AdamW's exp_avg and exp_avg_sq 8 bytes a trainable parameter, nothing else.
    EXPECT_EQ(m["grad_bytes"].get<int64_t>(), 4 * m["trainable"].get<int64_t>()) << m.dump();
    EXPECT_EQ(m["optimizer_bytes"].get<int64_t>(), 8 * m["trainable"].get<int64_t>()) << m.dump();
    EXPECT_EQ(m["weight_bytes"].get<int64_t>(), 4 * m["parameters"].get<int64_t>()) << m.dump();
    EXPECT_GT(m["step_seconds"].get<double>(), 0.0) << m.dump();
  }
  for (size_t i = 1; i < lines.size(); ++i) {
    EXPECT_EQ(lines[i]["parameters"].get<int64_t>() - full["parameters"].get<int64_t>(), lines[i]["trainable"])
        << "the adapters are the only new parameters and the only trainable ones";
    EXPECT_LT(lines[i]["memory_ratio"].get<double>(), 0.5) << lines[i].dump();
  }
  EXPECT_LT(lines[1]["trainable"].get<int64_t>(), lines[2]["trainable"].get<int64_t>());
}

}  // namespace
