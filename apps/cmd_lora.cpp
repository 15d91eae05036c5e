// `hybridflow lora merge --base DIR --adapter DIR --out DIR`: a PEFT LoRA adapter (written by hybridflow or by
// Hugging Face PEFT) merged into its base model, written as a plain Hugging Face model directory that
// transformers, vLLM or `hybridflow generate` load without PEFT (model/lora.h's write_merged_lora_model).
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "hybridflow/model/lora.h"

namespace hybridflow::cli {
namespace {

struct LoraMergeOptions {
  std::string base_dir, adapter_dir, out_dir;
};

int run_lora_merge(const LoraMergeOptions& o) {
  write_merged_lora_model(o.base_dir, o.adapter_dir, o.out_dir);
  std::printf("merged %s into %s: %s\n", o.adapter_dir.c_str(), o.base_dir.c_str(), o.out_dir.c_str());
  return 0;
}

}  // namespace

void add_lora_command(CLI::App& app, Action& action) {
  CLI::App* lora = app.add_subcommand("lora", "LoRA adapters in PEFT's format (docs/lora.md)");
  lora->require_subcommand(1);
  auto o = std::make_shared<LoraMergeOptions>();
  CLI::App* merge = lora->add_subcommand(
      "merge", "Write base + adapter as a plain Hugging Face model directory (W + lora_alpha / r * B A)");
  merge->add_option("--base", o->base_dir, "the base model directory (config.json, weights, tokenizer.json)")
      ->required();
  merge->add_option("--adapter", o->adapter_dir, "the adapter directory (adapter_config.json, "
                                                 "adapter_model.safetensors)")
      ->required();
  merge->add_option("--out", o->out_dir, "the merged model directory to write")->required();
  merge->callback([o, &action] { action = [o] { return run_lora_merge(*o); }; });
}

}  // namespace hybridflow::cli
