// `hybridflow init`: a randomly initialised model directory (config.json, model.safetensors,
// tokenizer.json) from a named preset (model/model_presets.h): a test shape with the tokenizer alphabet of a
// built-in task, or a published architecture's shape with a published tokenizer (--tokenizer).
#include <torch/torch.h>

#include <cstdio>
#include <string>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/model/transformer.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow::cli {

void add_init_command(CLI::App& app, Action& action) {
  struct Options {
    std::string preset = "tiny";
    std::string task = "addition";
    std::string alphabet;
    std::string out;
    std::string dtype = "float32";
    uint64_t seed = 0;
    bool value_head = false;
    std::string tokenizer;
    int64_t vocab_multiple = 1;
  };
  auto opts = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("init", "Create a randomly initialised model directory from a preset");
  cmd->add_option("--preset", opts->preset,
                  "a test shape or a published architecture (random weights; give it --tokenizer of its family): " +
                      model_preset_list())
      ->capture_default_str();
  cmd->add_option("--task", opts->task, "built-in task whose characters the tokenizer covers")->capture_default_str();
  cmd->add_option("--alphabet", opts->alphabet, "explicit tokenizer characters (overrides --task)");
  cmd->add_option("--tokenizer", opts->tokenizer,
                  "directory with a published tokenizer.json (and tokenizer_config.json) to use instead");
  cmd->add_option("--vocab-multiple", opts->vocab_multiple,
                  "pad the embedding to a multiple of this many rows, as Qwen pads its vocabulary")
      ->capture_default_str();
  cmd->add_option("--out", opts->out, "output directory")->required();
  cmd->add_option("--dtype", opts->dtype,
                  "storage dtype: float32 | bfloat16 | float16 (or fp32 | bf16 | fp16); bf16 halves the files of "
                  "the published shapes")
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "initialisation seed")->capture_default_str();
  cmd->add_flag("--value-head", opts->value_head, "scalar value head (critic / reward model) instead of an LM head");
  cmd->callback([cmd, opts, &action] {
    (void)cmd;
    action = [opts] {
      init_threads();
      HF_CHECK(opts->vocab_multiple >= 1, "init: --vocab-multiple must be >= 1, got ", opts->vocab_multiple);
      Tokenizer tokenizer = opts->tokenizer.empty()
                                ? Tokenizer::from_alphabet(opts->alphabet.empty() ? make_task(opts->task)->alphabet()
                                                                                  : opts->alphabet)
                                : Tokenizer::load(opts->tokenizer + "/tokenizer.json");
      const int64_t vocab =
          (tokenizer.vocab_size() + opts->vocab_multiple - 1) / opts->vocab_multiple * opts->vocab_multiple;
      ModelConfig config = preset_model_config(opts->preset, vocab);
      config.bos_token_id = tokenizer.bos_id();
      config.eos_token_id = tokenizer.eos_id();
      config.pad_token_id = tokenizer.pad_id();
      const torch::Dtype dtype = parse_dtype(opts->dtype, "init: --dtype");
      config.torch_dtype = dtype == torch::kBFloat16 ? "bfloat16" : dtype == torch::kFloat16 ? "float16" : "float32";
      config.validate();
      torch::manual_seed(opts->seed);
      CausalLM model(config, opts->value_head ? HeadKind::kValue : HeadKind::kLanguageModel);
      save_pretrained(opts->out, model, tokenizer);
      std::printf("wrote %s: %s preset, %lld parameters, vocab %lld, %s weights\n", opts->out.c_str(),
                  opts->preset.c_str(), static_cast<long long>(config.num_parameters()),
                  static_cast<long long>(config.vocab_size), config.torch_dtype.c_str());
      return 0;
    };
  });
}

}  // namespace hybridflow::cli
