// The C++ half of the transformers oracles (tests/engine/hf_oracle.py, tests/model/moe_oracle.py): random
// tiny models saved here for transformers to score, the script run once over them and over the models it
// writes itself, and the comparisons both directions make.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "hybridflow/model/pretrained.h"
#include "hybridflow/model/safetensors.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"

namespace hybridflow::testing {

inline std::map<std::string, torch::Tensor> read_tensors(const std::string& path) {
  auto file = read_safetensors(path);
  return {file.tensors.begin(), file.tensors.end()};
}

// The oracle scripts' randomize(): norms around 1, biases of 0.5, embeddings N(0, 1), projections with
// unit-variance outputs times 2. HF's own init (zero biases, unit norms, std 0.02) would leave biases and
// norms untested, attention nearly uniform and routers near ties.
inline void randomize_like_oracle(CausalLM& model, uint64_t seed) {
  torch::manual_seed(seed);
  torch::NoGradGuard no_grad;
  for (auto& item : model->named_parameters()) {
    const std::string& name = item.key();
    auto& p = item.value();
    auto noise = torch::randn(p.sizes());
    if (name.ends_with("norm.weight"))
      p.copy_(1.0 + 0.3 * noise);
    else if (name.ends_with(".bias"))
      p.copy_(0.5 * noise);
    else if (name.ends_with("embed_tokens.weight"))
      p.copy_(noise);
    else
      p.copy_(2.0 * noise / std::sqrt(static_cast<double>(p.size(1))));
  }
}

// Max |a - b| over the positions of real tokens; logits of padding positions mean nothing in either.
inline double max_diff_on_real_tokens(const torch::Tensor& a, const torch::Tensor& b, const torch::Tensor& mask) {
  if (a.sizes() != b.sizes()) return INFINITY;
  auto real = mask.to(torch::kBool);
  return (a.index({real}) - b.index({real})).abs().max().item<double>();
}

// Everything the Python side produced, made once per test suite: hybridflow's models (config_of(name),
// randomized from consecutive seeds) saved under from_hybridflow/<name>, then `script` run with
// --reference-dir transformers --score-dirs <those directories>.
struct TransformersOracle {
  TempDir dir;
  std::string python = python_for_tests();
  bool python_found = false;
  CommandResult run;
  std::map<std::string, CausalLM> hybridflow_models;

  std::string reference_dir(const std::string& name) const { return dir.file("transformers/" + name); }
  std::string hybridflow_dir(const std::string& name) const { return dir.file("from_hybridflow/" + name); }

  TransformersOracle(const std::string& script, const std::vector<std::string>& names, const Tokenizer& tok,
                     const std::function<ModelConfig(const std::string&)>& config_of, uint64_t first_seed) {
    uint64_t seed = first_seed;
    for (const auto& name : names) {
      CausalLM model(config_of(name));
      randomize_like_oracle(model, seed++);
      save_pretrained(hybridflow_dir(name), model, tok);
      hybridflow_models.emplace(name, model);
    }
    python_found = std::filesystem::exists(python);
    if (!python_found) return;
    std::string cmd = "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 " + shell_quote(python) + " " + shell_quote(script) +
                      " --reference-dir " + shell_quote(dir.file("transformers")) + " --score-dirs";
    for (const auto& name : names) cmd += " " + shell_quote(hybridflow_dir(name));
    run = run_shell(cmd);
  }

  // Why the suite cannot compare anything; empty when the script ran.
  std::string failure(const std::string& script_name) const {
    if (!python_found)
      return "no Python at " + python + ": run scripts/setup.sh (it makes .venv with transformers), or set HF_PYTHON "
             "to a python that has torch, transformers and safetensors";
    if (run.exit_code != 0)
      return script_name + " failed (run scripts/setup.sh if transformers is missing from the venv):\n" + run.output;
    return "";
  }
};

}  // namespace hybridflow::testing
