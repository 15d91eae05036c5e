// `hybridflow info [MODEL | --preset NAME]`: this build and machine (libtorch, devices, bf16 support, collective
// backends); with a model directory or a named preset, its architecture, parameters, weight bytes, KV cache
// per token and the memory one rank of a training role needs (model/model_size.h's training_memory, the
// formula the placement planner budgets with). A model directory's weight files are also checked against
// config.json (their headers only: nothing is loaded); exits 1 naming each problem.
#include <cstdio>
#include <string>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/placement/model_shape.h"

namespace hybridflow::cli {

namespace {

struct InfoOptions {
  std::string dir;
  std::string preset;
  std::string role = "actor";
  std::string dtype = "bf16";
  int64_t batch = 1;
  int64_t seq = 1024;
  int64_t tp = 1, pp = 1, zero = 1;
};

long long ll(int64_t v) { return static_cast<long long>(v); }

void print_architecture(const ModelConfig& c) {
  std::printf("architecture     %s (%s)\n", c.architecture.c_str(), c.model_type.c_str());
  std::printf("vocab_size       %lld\n", ll(c.vocab_size));
  std::printf("hidden_size      %lld\n", ll(c.hidden_size));
  std::printf("intermediate     %lld\n", ll(c.intermediate_size));
  std::printf("layers           %lld\n", ll(c.num_hidden_layers));
  std::printf("heads / kv heads %lld / %lld (head_dim %lld)\n", ll(c.num_attention_heads), ll(c.num_key_value_heads),
              ll(c.head_dim()));
  std::printf("max positions    %lld, rope_theta %g, rms_norm_eps %g\n", ll(c.max_position_embeddings), c.rope_theta,
              c.rms_norm_eps);
  if (c.rope_scaling.scaled())
    std::printf("rope scaling     %s, factor %g, original context %lld\n", c.rope_scaling.type.c_str(),
                c.rope_scaling.factor, ll(c.rope_scaling.original_max_position_embeddings));
  if (c.sliding_window > 0) std::printf("sliding window   %lld\n", ll(c.sliding_window));
  if (c.qk_norm()) std::printf("q/k head norms   yes\n");
  if (c.num_moe_layers() > 0)
    std::printf("experts          %lld per MoE layer (%lld of %lld layers), %lld per token%s, width %lld%s, "
                "router_aux_loss_coef %g\n",
                ll(c.moe.num_experts), ll(c.num_moe_layers()), ll(c.num_hidden_layers), ll(c.moe.num_experts_per_tok),
                c.moe.norm_topk_prob || c.model_type == "mixtral" ? " (renormalised)" : "",
                ll(c.expert_intermediate_size()),
                c.shared_expert() ? (", shared expert width " + std::to_string(c.moe.shared_expert_intermediate_size)).c_str()
                                  : "",
                c.moe.router_aux_loss_coef);
  std::printf("tied embeddings  %s, qkv bias %s\n", c.tie_word_embeddings ? "yes" : "no",
              c.attention_bias ? "yes" : "no");
  std::printf("dtype            %s\n", c.torch_dtype.c_str());
}

void print_sizes(const ModelConfig& c, const InfoOptions& o) {
  const bool critic = o.role == "critic";
  const ModelSize size = model_size(c, critic);
  const double p = size.parameters();
  std::printf("parameters       %.0f (%.3f B%s): embedding %.0f (%s), non-embedding %.0f\n", p, p / 1e9,
              critic ? ", with a value head instead of lm_head" : "", size.embeddings,
              critic || c.tie_word_embeddings ? "embed_tokens" : "embed_tokens + lm_head", p - size.embeddings);
  if (size.experts > 0)
    std::printf("active           %.0f (%.3f B) per token: routed experts %.0f in all, %.0f of them per token\n",
                size.active_parameters(), size.active_parameters() / 1e9, size.experts, size.active_experts);
  std::printf("weight bytes     fp32 %s, bf16 %s\n", human_bytes(p * 4).c_str(), human_bytes(p * 2).c_str());
  const placement::ModelShape shape = placement::model_shape_of(c, "model");
  std::printf("KV cache         %s per token in bf16 (%s in fp32): K and V of %lld layers x %lld KV heads x head_dim %lld\n",
              human_bytes(shape.kv_bytes_per_token(2)).c_str(), human_bytes(shape.kv_bytes_per_token(4)).c_str(),
              ll(c.num_hidden_layers), ll(c.num_key_value_heads), ll(c.head_dim()));

  TrainingMemoryOptions t;
  t.weight_bytes = o.dtype == "bf16" ? 2 : 4;
  t.tp = o.tp;
  t.pp = o.pp;
  t.zero = o.zero;
  t.micro_rows = o.batch;
  t.sequence = o.seq;
  t.value_head = critic;
  const TrainingMemory m = training_memory(c, t);
  const bool mixed = t.weight_bytes == 2;
  std::printf("training memory  %s, %s, micro-batch %lld x %lld tokens, tp %lld, pp %lld, ZeRO-1 over %lld, per rank:\n",
              o.role.c_str(), mixed ? "bf16 weights, fp32 masters" : "fp32 weights", ll(o.batch), ll(o.seq), ll(o.tp),
              ll(o.pp), ll(o.zero));
  auto line = [](const char* what, double bytes, const std::string& note) {
    std::printf("  %-26s %10s  %s\n", what, human_bytes(bytes).c_str(), note.c_str());
  };
  line("weights", m.weights, mixed ? "bf16" : "fp32");
  line("gradients", m.grads, mixed ? "bf16 of a micro-batch + fp32 accumulated beside the masters" : "fp32");
  line("fp32 masters", m.masters, mixed ? "whole on every ZeRO rank" : "none: the fp32 weights are stepped");
  line("Adam moments", m.adam, "fp32 exp_avg + exp_avg_sq, partitioned by ZeRO-1");
  line("activations", m.activations, "17 x hidden values per token per layer, every layer kept");
  line("activations, checkpointed", m.checkpointed_activations, "each layer's input + one layer recomputed");
  line("logits + gradient", m.logits,
       critic ? "none: a value head" : "fp32, tokens x vocabulary " + std::to_string(c.vocab_size) + " / tp");
  std::printf("  %-26s %10s  without activation checkpointing; %s with it\n", "total", human_bytes(m.peak(false)).c_str(),
              human_bytes(m.peak(true)).c_str());
  if (size.experts > 0 && o.tp > 1) {
    // The figures divide the experts by tp too, which holds when they fold over the tensor-parallel ranks.
    const double held = size.parameters() / static_cast<double>(o.tp * o.pp);
    const double per_parameter = (m.weights + m.grads + m.masters + m.adam) / held;
    const double unsplit = size.experts * (1.0 - 1.0 / static_cast<double>(o.tp)) / static_cast<double>(o.pp);
    std::printf("  experts: as with expert_model_parallel_size = tp (%lld, Megatron's folding over the tensor-parallel "
                "ranks); at 1 every tensor rank holds every expert: %s more, %s in all\n",
                ll(o.tp), human_bytes(unsplit * per_parameter).c_str(),
                human_bytes(m.peak(false) + unsplit * per_parameter).c_str());
  }
}

int run_info(const InfoOptions& o) {
  HF_CHECK(o.dir.empty() || o.preset.empty(), "info: give a model directory or --preset, not both");
  HF_CHECK(o.role == "actor" || o.role == "critic", "info: --role must be actor or critic, got '", o.role, "'");
  HF_CHECK(o.dtype == "bf16" || o.dtype == "fp32", "info: --dtype must be bf16 or fp32, got '", o.dtype, "'");
  HF_CHECK(o.batch >= 1 && o.seq >= 1 && o.tp >= 1 && o.pp >= 1 && o.zero >= 1,
           "info: --batch, --seq, --tp, --pp and --zero must be >= 1");
  if (o.dir.empty() && o.preset.empty()) {
    std::fputs(format_runtime_info(runtime_info()).c_str(), stdout);
    return 0;
  }
  if (!o.preset.empty()) {
    const std::optional<ModelPreset> preset = find_model_preset(o.preset);
    HF_CHECK(preset.has_value(), "info: unknown --preset '", o.preset, "'; expected one of: ", model_preset_list());
    ModelConfig c = preset->config;
    if (!preset->published) c.vocab_size = 32000;  // a test shape takes its tokenizer's; shown at a typical size
    std::printf("model            %s (%s%s)\n", o.preset.c_str(), preset->source.c_str(),
                preset->published ? "" : "; vocabulary 32000 for this table, the tokenizer's in `init`");
    print_architecture(c);
    print_sizes(c, o);
    return 0;
  }
  const ModelConfig c = load_model_config(o.dir + "/config.json");
  std::printf("model            %s\n", o.dir.c_str());
  print_architecture(c);
  print_sizes(c, o);
  // The weights' headers against their files and config.json: a truncated or mismatched model is not fine.
  const std::vector<std::string> problems = check_model_directory(o.dir);
  if (problems.empty()) {
    std::printf("weights          ok (headers, sizes and shapes match config.json)\n");
    return 0;
  }
  for (const std::string& problem : problems) std::fprintf(stderr, "problem: %s\n", problem.c_str());
  std::fprintf(stderr, "%s: %zu problem(s); this model will not load\n", o.dir.c_str(), problems.size());
  return 1;
}

}  // namespace

void add_info_command(CLI::App& app, Action& action) {
  auto o = std::make_shared<InfoOptions>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Print libtorch version, devices, bf16 support and collective backends; with a model directory or "
              "--preset, its architecture, parameters, weight bytes and the memory a rank needs to train it");
  cmd->add_option("model", o->dir, "model directory (config.json inside)");
  cmd->add_option("--preset", o->preset, "a named shape instead of a directory: " + model_preset_list());
  cmd->add_option("--role", o->role, "actor (language-model head) | critic (value head)")->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per training micro-batch")->capture_default_str();
  cmd->add_option("--seq", o->seq, "tokens per sequence (prompt + response)")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "training dtype: bf16 (fp32 masters) | fp32")->capture_default_str();
  cmd->add_option("--tp", o->tp, "tensor-parallel ranks the weights and activations are split over")
      ->capture_default_str();
  cmd->add_option("--pp", o->pp, "pipeline stages the layers are split over")->capture_default_str();
  cmd->add_option("--zero", o->zero, "data-parallel ranks the Adam moments are partitioned over (ZeRO-1)")
      ->capture_default_str();
  cmd->callback([o, &action] { action = [o] { return run_info(*o); }; });
}

}  // namespace hybridflow::cli
