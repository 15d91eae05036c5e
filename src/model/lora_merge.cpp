// `hybridflow lora merge`: base model directory + PEFT adapter -> a plain Hugging Face model directory.
#include <filesystem>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/lora.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow {
namespace {

// The files of a Hugging Face model directory that describe the model or its tokenizer rather than its
// weights: copied byte for byte, so the merged directory is the base's but for model.safetensors.
constexpr const char* kLoraMergeCopiedFiles[] = {
    "config.json",          "generation_config.json", "tokenizer.json",   "tokenizer_config.json",
    "special_tokens_map.json", "added_tokens.json",   "vocab.json",       "merges.txt",
    "tokenizer.model",      "chat_template.jinja",    "chat_template.json"};

std::string lora_merge_canonical(const std::string& dir) {
  std::error_code ec;
  const auto path = std::filesystem::weakly_canonical(dir, ec);
  return ec ? dir : path.string();
}

}  // namespace

void write_merged_lora_model(const std::string& base_dir, const std::string& adapter_dir, const std::string& out_dir) {
  HF_CHECK(lora_merge_canonical(out_dir) != lora_merge_canonical(base_dir) &&
               lora_merge_canonical(out_dir) != lora_merge_canonical(adapter_dir),
           "lora merge: --out ", out_dir, " is the base or the adapter directory; give a new directory");
  HF_CHECK(file_exists(adapter_dir + "/adapter_config.json"), adapter_dir,
           "/adapter_config.json does not exist (expected a PEFT LoRA adapter directory)");
  // fp32 in memory whatever the files hold: W + scaling * B A is rounded once, to the base's torch_dtype, when
  // written.
  Pretrained base = load_pretrained(base_dir, HeadKind::kLanguageModel, torch::kFloat32);
  load_lora_adapter(adapter_dir, base.model);
  base.model->merge_lora();
  save_pretrained(out_dir, base.model, base.tokenizer);
  for (const char* name : kLoraMergeCopiedFiles) {
    const std::string from = base_dir + "/" + name;
    if (file_exists(from)) write_file_atomic(out_dir + "/" + name, read_file(from));
  }
}

}  // namespace hybridflow
