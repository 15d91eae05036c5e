// `hybridflow bench machine | generate | train`: throughput of this build on this machine, each figure next to
// the bound that limits it, measured in the same run (docs/performance.md); `bench lora`: the memory of LoRA
// adapters against full fine-tuning (docs/lora.md). Random weights of any shape, so
// nothing needs downloading: --preset NAME builds a published architecture's shape (model/model_presets.h);
// --model DIR measures a real model directory instead.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench_output.h"
#include "commands.h"
#include "hybridflow/core/cpu_memory.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/roofline.h"
#include "hybridflow/perf/lora_bench.h"
#include "hybridflow/perf/speed_bench.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/model_presets.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow::cli {

namespace {

struct BenchOptions {
  std::string model_dir;
  std::string preset;
  int64_t hidden = 512, layers = 8, heads = 8, kv_heads = 0, ffn = 0, vocab = 4096;
  std::string dtype = "fp32";
  std::string device = "cpu";  // generate and train: cpu | cuda
  bool rollout_only = false;   // generate: the rollout lines alone (no decode and prefill runs before them)
  int threads = 0;
  std::vector<int64_t> batches;  // empty: each subcommand's default
  int64_t prompt_length = 32, response_length = 64;
  int64_t rollout_prompts = 64, samples = 8, stop_every = 8;
  int64_t max_num_seqs = 1024;  // the trainer's default (actor_rollout_ref.rollout.max_num_seqs)
  int64_t admission_rows = -1;  // the trainer's default (actor_rollout_ref.rollout.admission_rows)
  bool static_baseline = true;
  std::string kv_cache = "paged";  // continuous batching's KV cache: paged | slots
  int64_t kv_block_size = 16;
  int64_t shared_prefix = 0;       // rollout: ids every prompt begins with; > 0 also times prefix caching off
  int64_t max_num_batched_tokens = 8192;  // the trainer's default (actor_rollout_ref.rollout.max_num_batched_tokens)
  bool slots_baseline = false;     // also decode and roll out on the slots (same run) when kv_cache is paged
  bool cuda_graphs = false;        // paged decode steps replayed as CUDA graphs (--device cuda)
  bool kept_pools = false;         // rollout: also time a call on the pools and graphs the first call kept
  int64_t readback_interval = 1;   // decode steps between two reads of the device
  double memory_budget_mb = 0;     // the rollout's paged pool: gpu_memory_utilization of this, less the weights
  double gpu_memory_utilization = 0.5;
  int64_t steps = 3;
  int64_t rl_rows = 32, micro_rows = 8;
  std::vector<int64_t> logits_vocab = {32768, 151936};
  int64_t logits_tokens = 1024;
  int64_t stream_mb = 64;
  std::vector<int64_t> lora_ranks = {8, 32, 128};  // lora: against full fine-tuning
  double lora_alpha = 16;
  int64_t preset_layers = 0;  // lora: a preset with fewer decoder layers (0 = the preset's)
  bool json = false;
  int decode_reps = 2;         // generate: timed runs of each decode length (the fastest counts)
  std::string profile;         // generate / train: a Kineto profile (decode steps / a step) instead of the speed lines
  int64_t profile_steps = 8;
};

void add_common_options(CLI::App* cmd, BenchOptions& o) {
  cmd->add_option("--model", o.model_dir, "a model directory instead of random weights of the shape below");
  cmd->add_option("--preset", o.preset,
                  "random weights of a named shape instead of the one below (published ones keep their "
                  "vocabulary; test shapes take --vocab): " + model_preset_list());
  cmd->add_option("--hidden-size", o.hidden)->capture_default_str();
  cmd->add_option("--layers", o.layers)->capture_default_str();
  cmd->add_option("--heads", o.heads)->capture_default_str();
  cmd->add_option("--kv-heads", o.kv_heads, "0 = --heads")->capture_default_str();
  cmd->add_option("--ffn", o.ffn, "MLP width; 0 = 3 x --hidden-size")->capture_default_str();
  cmd->add_option("--vocab", o.vocab)->capture_default_str();
  cmd->add_option("--dtype", o.dtype, "fp32 | bf16 | fp16")->capture_default_str();
  cmd->add_option("--threads", o.threads, "0 = one per core")->capture_default_str();
  cmd->add_option("--batch", o.batches, "rows per step (repeatable or comma-separated)")->delimiter(',');
  cmd->add_option("--prompt-length", o.prompt_length)->capture_default_str();
  cmd->add_option("--response-length", o.response_length, "new tokens per decode run; the rollout's maximum")
      ->capture_default_str();
  cmd->add_flag("--json", o.json, "one JSON object per measurement");
}

struct Setup {
  ModelConfig config;
  torch::Dtype dtype = torch::kFloat32;
  torch::Device device = torch::kCPU;
  std::shared_ptr<CausalLM> model;  // only for generate and train
  // On a GPU the CPU's triad and matmuls bound nothing, and timing the device's own would need CUDA code
  // here: lines carry their units and kind with bound 0, and scripts/gpu_bench.sh divides by the device's
  // bandwidth and bf16 matmul peak, measured in the same run.
  bool measures_bounds() const { return !device.is_cuda(); }
};

ModelConfig config_from(const BenchOptions& o) {
  if (!o.preset.empty()) {
    ModelConfig c = preset_model_config(o.preset, o.vocab);
    if (o.preset_layers > 0) c.num_hidden_layers = o.preset_layers;
    return c;
  }
  ModelConfig c;
  c.vocab_size = o.vocab;
  c.hidden_size = o.hidden;
  c.num_hidden_layers = o.layers;
  c.num_attention_heads = o.heads;
  c.num_key_value_heads = o.kv_heads > 0 ? o.kv_heads : o.heads;
  // 3 x hidden: with hidden 512, 8 layers and vocab 4096 this is the 31.5M-parameter shape of issue 14.
  c.intermediate_size = o.ffn > 0 ? o.ffn : 3 * o.hidden;
  c.max_position_embeddings = std::max<int64_t>(2048, o.prompt_length + o.response_length);
  c.validate();
  return c;
}

// roofline_table: the header of the Measurement lines (bench lora prints a table of its own).
Setup setup(const BenchOptions& o, bool with_model, bool roofline_table = true) {
  HF_CHECK(o.prompt_length > 0, "bench: --prompt-length must be positive, got ", o.prompt_length);
  HF_CHECK(o.response_length >= 2, "bench: --response-length must be at least 2, got ", o.response_length);
  for (int64_t b : o.batches) HF_CHECK(b > 0, "bench: --batch must be positive, got ", b);
  init_threads(o.threads);
  warn_if_slow_blas();
  Setup s;
  s.dtype = parse_dtype(o.dtype, "--dtype");
  s.device = torch::Device(resolve_device_name(o.device, "--device"));
  HF_CHECK(o.model_dir.empty() || o.preset.empty(), "bench: give --preset or --model, not both");
  if (!o.model_dir.empty()) {
    Pretrained pre = load_pretrained(o.model_dir, HeadKind::kLanguageModel, s.dtype);
    s.config = pre.config;
    if (with_model) s.model = std::make_shared<CausalLM>(pre.model);
  } else {
    s.config = config_from(o);
    if (with_model) {
      torch::manual_seed(0);
      s.model = std::make_shared<CausalLM>(s.config);
      (*s.model)->to(s.dtype);
    }
  }
  if (s.model) (*s.model)->to(s.device);
  HF_CHECK(s.config.max_position_embeddings >= o.prompt_length + o.response_length, "bench: --prompt-length + ",
           "--response-length (", o.prompt_length + o.response_length, ") exceed the model's max_position_embeddings (",
           s.config.max_position_embeddings, ")");
  if (!o.json) {
    const ModelConfig& c = s.config;
    std::printf("model: %.1fM parameters (hidden %lld, %lld layers, %lld/%lld heads, ffn %lld, vocab %lld), %s, "
                "%d threads, BLAS %s, %s\n",
                static_cast<double>(c.num_parameters()) / 1e6, static_cast<long long>(c.hidden_size),
                static_cast<long long>(c.num_hidden_layers), static_cast<long long>(c.num_attention_heads),
                static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.intermediate_size),
                static_cast<long long>(c.vocab_size), o.dtype.c_str(), at::get_num_threads(), detect_blas().library.c_str(),
                s.device.str().c_str());
  }
  if (roofline_table) print_header(o.json);
  return s;
}

std::vector<int64_t> batches_or(const BenchOptions& o, std::vector<int64_t> fallback) {
  return o.batches.empty() ? fallback : o.batches;
}

// The triad: the bound of batch-1 decode, which must read every weight once per token.
Measurement measure_bandwidth(const BenchOptions& o, const Setup& s) {
  Measurement m;
  m.what = "stream triad";
  m.units = "GB/s";
  m.bound_kind = "bandwidth";
  m.achieved = m.bound = stream_triad_gb_per_s(o.stream_mb * 1024 * 1024 / 4);
  m.tokens_per_s = m.bound * 1e9 / decode_weight_bytes(s.config, s.dtype);
  m.extra["array_mb"] = o.stream_mb;
  return m;
}

// The model's matmuls alone at `rows` rows: the bound of every compute-limited figure at that row count.
Measurement measure_matmul_pass(const Setup& s, int64_t rows, const std::string& what = "matmul pass") {
  const MatmulTiming t = time_matmuls(model_matmul_shapes(s.config), rows, s.dtype);
  Measurement m;
  m.what = what;
  m.batch = rows;
  m.units = "GFLOP/s";
  m.bound_kind = "matmul";
  m.achieved = m.bound = t.gflops();
  m.tokens_per_s = static_cast<double>(rows) / t.seconds;
  return m;
}

// The model's matmul bound at `rows` rows where this run measures bounds (the CPU), else the line's units and
// kind with bound 0 (see Setup::measures_bounds).
Measurement matmul_bound(const Setup& s, int64_t rows) {
  if (s.measures_bounds()) return measure_matmul_pass(s, rows);
  Measurement m;
  m.what = "matmul pass";
  m.batch = rows;
  m.units = "GFLOP/s";
  m.bound_kind = "matmul";
  return m;
}

int run_machine(const BenchOptions& o) {
  Setup s = setup(o, false);
  print_measurement(measure_bandwidth(o, s), o.json);
  // Each shape's speed against the best the model's matmuls reach (the largest row count).
  const int64_t big = std::max<int64_t>(512, 8 * (o.prompt_length + o.response_length));
  Measurement peak = measure_matmul_pass(s, big);
  std::vector<int64_t> rows = batches_or(o, {1, 8, 32});
  rows.push_back(32 * o.prompt_length);
  for (int64_t r : rows) {
    Measurement m = measure_matmul_pass(s, r);
    m.bound = peak.bound;
    print_measurement(m, o.json);
  }
  print_measurement(peak, o.json);
  for (const MatmulShape& shape : model_matmul_shapes(s.config)) {
    if (shape.name == "k_proj" || shape.name == "v_proj" || shape.name == "up_proj") continue;  // same as q / gate
    const MatmulTiming t = time_matmuls({shape}, big, s.dtype, 0.2);
    Measurement m;
    m.what = "matmul " + shape.name;
    m.batch = big;
    m.units = "GFLOP/s";
    m.bound_kind = "matmul";
    m.achieved = t.gflops();
    m.bound = peak.bound;
    m.tokens_per_s = static_cast<double>(big) / t.seconds;
    m.extra["shape"] = std::to_string(big) + "x" + std::to_string(shape.in_features) + "x" +
                       std::to_string(shape.out_features);
    print_measurement(m, o.json);
  }
  return 0;
}

// --kv-cache: continuous batching on the paged cache (with --slots-baseline also on the slots, in the same
// run) or on the slots. Off by default: at a real size the slots' slabs may not fit where the blocks do.
bool paged_kv_cache(const BenchOptions& o) {
  HF_CHECK(o.kv_cache == "paged" || o.kv_cache == "slots", "bench: --kv-cache must be paged or slots, got '",
           o.kv_cache, "'");
  return o.kv_cache == "paged";
}
bool compares_slots(const BenchOptions& o) { return paged_kv_cache(o) && o.slots_baseline; }

// --cuda-graphs: asked for, graphs must be able to run (a GPU, the paged cache); the generator would otherwise
// decode eagerly and the figures would not be the graphs'.
bool cuda_graphs(const BenchOptions& o, const Setup& s) {
  if (!o.cuda_graphs) return false;
  HF_CHECK(s.device.is_cuda(), "bench: --cuda-graphs replays decode steps as CUDA graphs, which need --device cuda ",
           "(got ", s.device.str(), ")");
  HF_CHECK(paged_kv_cache(o), "bench: --cuda-graphs decodes on the paged KV cache; drop --kv-cache slots");
  HF_CHECK(s.model && (*s.model)->decodes_on_device(), "bench: --cuda-graphs: CUDA graphs do not cover this model ",
           "(experts, dynamic RoPE scaling or batch-invariant kernels)");
  return true;
}

// The KV cache's figures: the peak it held, and on a paged line beside the slots the slots' peak and the
// ratio of their times.
void add_cache_extras(const BenchOptions& o, Measurement& m, bool on_paged, int64_t peak_bytes, double seconds,
                      double slots_seconds, int64_t slots_peak_bytes) {
  m.extra["kv_cache"] = on_paged ? "paged" : "slots";
  m.extra["kv_peak_MB"] = static_cast<double>(peak_bytes) / 1e6;
  if (!on_paged) return;
  m.extra["kv_block_size"] = o.kv_block_size;
  if (!compares_slots(o)) return;
  m.extra["slots_kv_peak_MB"] = static_cast<double>(slots_peak_bytes) / 1e6;
  m.extra["speed_vs_slots"] = slots_seconds / seconds;
}

void run_decode_and_prefill(const BenchOptions& o, const Setup& s) {
  HF_CHECK(o.decode_reps >= 1, "bench: --reps must be at least 1, got ", o.decode_reps);
  CausalLM& model = *s.model;
  Measurement bandwidth;
  if (s.measures_bounds()) {
    bandwidth = measure_bandwidth(o, s);
    print_measurement(bandwidth, o.json);
  }
  const std::vector<int64_t> batches = batches_or(o, {1, 8, 32});
  // Decode attends to the prompt and, on average, half the response.
  const double decode_context = static_cast<double>(o.prompt_length) + static_cast<double>(o.response_length) / 2.0;
  const bool paged = paged_kv_cache(o), compare_slots = compares_slots(o), graphs = cuda_graphs(o, s);
  DecodeSpeed last;
  for (int64_t b : batches) {
    const DecodeSpeed speed =
        measure_decode(model, b, o.prompt_length, o.response_length, o.decode_reps, paged, o.kv_block_size, graphs,
                       o.readback_interval);
    const DecodeSpeed slots =
        compare_slots ? measure_decode(model, b, o.prompt_length, o.response_length, 2, false) : DecodeSpeed{};
    last = speed;
    Measurement m;
    m.what = "decode";
    m.batch = b;
    m.tokens_per_s = speed.decode_tokens_per_s;
    if (b == 1) {  // one row: every weight is read per token, memory bound
      m.units = "GB/s";
      m.bound_kind = "bandwidth";
      m.achieved = decode_weight_bytes(s.config, s.dtype) * m.tokens_per_s / 1e9;
      m.bound = bandwidth.bound;
    } else {  // several rows: the matmuls share each weight read, compute bound
      const Measurement pass = matmul_bound(s, b);
      m.units = pass.units;
      m.bound_kind = pass.bound_kind;
      m.bound = pass.bound;
      m.achieved = forward_flops_per_token(s.config, decode_context) * m.tokens_per_s / 1e9;
    }
    m.extra["seconds"] = speed.seconds;
    m.extra["prompt_length"] = o.prompt_length;
    m.extra["new_tokens"] = o.response_length;
    if (graphs) m.extra["cuda_graphs"] = true;
    // A decode step draws one token for every row; the prefill's read of the first tokens counts too.
    m.extra["readback_interval"] = o.readback_interval;
    m.extra["host_syncs_per_step"] = speed.host_syncs_per_step;
    m.extra["host_syncs_per_token"] = speed.host_syncs_per_step / static_cast<double>(b);
    // Decode alone: the time past the prefill, as decode_tokens_per_s.
    add_cache_extras(o, m, paged, speed.kv_peak_bytes, 1.0 / speed.decode_tokens_per_s,
                     compare_slots ? 1.0 / slots.decode_tokens_per_s : 0.0, slots.kv_peak_bytes);
    print_measurement(m, o.json);
  }
  // Prefill at the largest batch: the most rows, the most stable figure.
  const int64_t top = *std::max_element(batches.begin(), batches.end());
  Measurement prefill = matmul_bound(s, top * o.prompt_length);
  prefill.what = "prefill";
  prefill.batch = top;
  prefill.tokens_per_s = last.prefill_tokens_per_s;
  if (batches.back() != top) prefill.tokens_per_s = measure_decode(model, top, o.prompt_length, 2, 1).prefill_tokens_per_s;
  prefill.achieved =
      forward_flops_per_token(s.config, static_cast<double>(o.prompt_length)) * prefill.tokens_per_s / 1e9;
  prefill.extra["prompt_length"] = o.prompt_length;
  print_measurement(prefill, o.json);
}

void run_rollout(const BenchOptions& o, const Setup& s) {
  CausalLM& model = *s.model;
  // The rollout: useful work only (each prompt once, as its samples share its prefill, and every sample's
  // tokens up to its stop) per second, against the model's matmuls with every row of the batch busy. First
  // the static batch (the generator before continuous batching, same tokens), then continuous batching, and
  // the ratio of their times.
  const bool paged = paged_kv_cache(o), compare_slots = compares_slots(o);
  RolloutOptions ro;
  ro.prompts = o.rollout_prompts;
  ro.samples = o.samples;
  ro.prompt_length = o.prompt_length;
  ro.max_length = o.response_length;
  ro.stop_every = o.stop_every;
  ro.max_num_seqs = o.max_num_seqs;
  ro.admission_rows = o.admission_rows;
  ro.paged_kv_cache = paged;
  ro.kv_block_size = o.kv_block_size;
  ro.shared_prefix = o.shared_prefix;
  ro.max_num_batched_tokens = o.max_num_batched_tokens;
  ro.memory_budget_bytes = static_cast<int64_t>(o.memory_budget_mb * 1e6);
  ro.gpu_memory_utilization = o.gpu_memory_utilization;
  ro.cuda_graphs = cuda_graphs(o, s);
  ro.readback_interval = o.readback_interval;
  ro.continuous = false;
  const RolloutSpeed baseline = o.static_baseline ? measure_rollout(model, ro) : RolloutSpeed{};
  ro.continuous = true;
  ro.kept_pools = o.kept_pools && paged;
  const RolloutSpeed kept = measure_rollout(model, ro);
  ro.kept_pools = false;
  // Without --kept-pools the rollout is the one call; with it the first call (the same tokens: the same seed
  // and prompts) is the rollout line and the second its own.
  RolloutSpeed r = kept;
  if (kept.first_seconds > 0) r.seconds = kept.first_seconds;
  // A shared prefix: the same rollout with prefix caching off, the baseline of the prefix it finds.
  const bool compare_prefix = o.shared_prefix > 0 && paged;
  ro.enable_prefix_caching = false;
  const RolloutSpeed uncached = compare_prefix ? measure_rollout(model, ro) : RolloutSpeed{};
  ro.enable_prefix_caching = true;
  ro.paged_kv_cache = false;
  const RolloutSpeed on_slots = compare_slots ? measure_rollout(model, ro) : RolloutSpeed{};
  auto rollout_line = [&](const RolloutSpeed& speed, const std::string& what) {
    Measurement m = matmul_bound(s, speed.rows);
    m.what = what;
    m.tokens_per_s = speed.tokens_per_s();
    // As in prefill and training, a prompt's score matrix counts whole; answers attend to the prompt and,
    // on average, half the answer.
    const double prompt_context = speed.prompt_tokens / static_cast<double>(speed.rows);
    const double answer_context = prompt_context + speed.mean_length / 2.0;
    // Counting each sample's copy of its prompt would credit work a generator need not do (ratios above 1), and
    // so would the positions prefix caching found in other prompts' blocks.
    const double distinct_prompt_tokens = speed.prompt_tokens / static_cast<double>(o.samples) -
                                          static_cast<double>(speed.kv_cache.prefix_cached_tokens);
    m.achieved = (forward_flops_per_token(s.config, prompt_context) * distinct_prompt_tokens +
                  forward_flops_per_token(s.config, answer_context) * speed.tokens) /
                 speed.seconds / 1e9;
    m.extra = {{"prompts", o.rollout_prompts}, {"samples", o.samples}, {"seconds", speed.seconds},
               {"mean_length", speed.mean_length}, {"max_length", speed.max_length},
               {"max_new_tokens", o.response_length}, {"stop_ids", speed.stop_ids},
               {"host_syncs_per_token", static_cast<double>(speed.host_syncs) / speed.tokens}};
    if (speed.prefills > 0) m.extra.update({{"prefills", speed.prefills}, {"decode_steps", speed.decode_steps}});
    if (speed.decode_graphs > 0)
      m.extra.update({{"decode_graphs", speed.decode_graphs},
                      {"graph_steps", speed.graph_steps}});
    return m;
  };
  if (o.static_baseline) print_measurement(rollout_line(baseline, "rollout static batch"), o.json);
  if (compare_slots) {
    Measurement m = rollout_line(on_slots, "rollout slots");
    add_cache_extras(o, m, false, on_slots.kv_cache.peak_bytes, 0, 0, 0);
    print_measurement(m, o.json);
  }
  if (compare_prefix) {
    Measurement m = rollout_line(uncached, "rollout prefix caching off");
    m.extra["kv_peak_blocks"] = uncached.kv_cache.peak_blocks;
    print_measurement(m, o.json);
  }
  Measurement rollout = rollout_line(r, "rollout");
  rollout.extra["max_num_seqs"] = o.max_num_seqs;
  rollout.extra["max_num_batched_tokens"] = o.max_num_batched_tokens;
  if (compare_prefix) {
    rollout.extra["shared_prefix"] = o.shared_prefix;
    rollout.extra["prefix_cached_tokens"] = r.kv_cache.prefix_cached_tokens;
    rollout.extra["speedup_vs_no_prefix_caching"] = uncached.seconds / r.seconds;
  }
  rollout.extra["admission_rows"] = o.admission_rows;
  if (o.static_baseline) rollout.extra["speedup_vs_static"] = baseline.seconds / r.seconds;
  add_cache_extras(o, rollout, paged, r.kv_cache.peak_bytes, r.seconds, on_slots.seconds, on_slots.kv_cache.peak_bytes);
  if (paged) {
    rollout.extra["kv_pool_blocks"] = r.kv_cache.pool_blocks;
    rollout.extra["kv_peak_blocks"] = r.kv_cache.peak_blocks;
    rollout.extra["kv_sequences_fit"] = r.kv_cache.sequences_fit;
  }
  print_measurement(rollout, o.json);
  if (kept.first_seconds > 0) {
    // An RL run's later rollouts (free_cache_engine: false): nothing allocated, no graph captured again.
    Measurement again = rollout_line(kept, "rollout kept pools");
    again.extra["kept_pools"] = kept.kept_pools;
    again.extra["graphs_captured"] = kept.graphs_captured;
    again.extra["speedup_vs_first"] = kept.first_seconds / kept.seconds;
    print_measurement(again, o.json);
  }
}

// The trace of batch b: FILE itself for one batch, else FILE with ".batchB" before a ".json" ending.
std::string profile_trace_path(const BenchOptions& o, int64_t batch, size_t batches) {
  if (batches == 1) return o.profile;
  const std::string suffix = ".batch" + std::to_string(batch);
  const std::string& f = o.profile;
  const bool json_ending = f.size() > 5 && f.compare(f.size() - 5, 5, ".json") == 0;
  return json_ending ? f.substr(0, f.size() - 5) + suffix + ".json" : f + suffix;
}

// One profile line: per step, operators, kernels and launches, busy time against wall time, the operators with
// the most self time, and where the trace went.
void print_profile(const BenchOptions& o, const Setup& s, const std::string& what, int64_t batch,
                   const ProfileStepSummary& step, const std::string& trace, nlohmann::json extra) {
  const char* busy_kind = s.device.is_cuda() ? "device" : "host operators";
  nlohmann::json top = nlohmann::json::array();
  for (const auto& t : step.top) top.push_back({{"name", t.name}, {"self_ms", t.self_seconds * 1e3}, {"calls", t.calls}});
  if (o.json) {
    nlohmann::json line = {{"what", what},
                           {"batch", batch},
                           {"steps", step.steps},
                           {"wall_ms_per_step", step.wall_seconds * 1e3},
                           {"busy_ms_per_step", step.busy_seconds * 1e3},
                           {"busy_ratio", step.busy_ratio()},
                           {"busy_kind", busy_kind},
                           {"operator_calls_per_step", step.operator_calls},
                           {"kernels_per_step", step.kernels},
                           {"launches_per_step", step.kernel_launches},
                           {"trace", trace},
                           {"top", top}};
    for (const auto& [key, value] : extra.items()) line[key] = value;
    std::printf("%s\n", line.dump().c_str());
  } else {
    std::printf("%s, batch %lld, %lld step(s), per step: wall %.3f ms, %s busy %.3f ms (%.2f of wall), %.1f operator "
                "calls, %.1f kernels, %.1f launches; %s; trace %s\n  top operators by %s self time (ms per step, "
                "calls):\n",
                what.c_str(), static_cast<long long>(batch), static_cast<long long>(step.steps),
                step.wall_seconds * 1e3, busy_kind, step.busy_seconds * 1e3, step.busy_ratio(), step.operator_calls,
                step.kernels, step.kernel_launches, extra.dump().c_str(), trace.c_str(),
                s.device.is_cuda() ? "device" : "host");
    for (const auto& t : step.top)
      std::printf("    %-48s %9.3f %8.1f\n", t.name.c_str(), t.self_seconds * 1e3, t.calls);
  }
  std::fflush(stdout);
}

// --profile: a few decode steps per batch under Kineto (the run of 1 + steps tokens less the run of 1),
// summarised per step, the trace written for each batch.
void run_decode_profile(const BenchOptions& o, const Setup& s) {
  const std::vector<int64_t> batches = batches_or(o, {1, 8, 32});
  for (int64_t b : batches) {
    const std::string trace = profile_trace_path(o, b, batches.size());
    const DecodeProfile p = profile_decode(*s.model, b, o.prompt_length, o.profile_steps, paged_kv_cache(o),
                                           o.kv_block_size, trace, cuda_graphs(o, s), o.readback_interval);
    print_profile(o, s, "decode profile", b, p.per_step, trace,
                  {{"prompt_length", o.prompt_length},
                   {"prefill_s", p.prefill_seconds},
                   {"readback_interval", o.readback_interval},
                   {"graph_steps", p.graph_steps}});
  }
}

int run_generate(const BenchOptions& o) {
  const Setup s = setup(o, true, /*roofline_table=*/o.profile.empty());
  if (!o.profile.empty()) {
    run_decode_profile(o, s);
    return 0;
  }
  if (!o.rollout_only) run_decode_and_prefill(o, s);
  run_rollout(o, s);
  return 0;
}

constexpr double kMB = 1e6;

// The RL passes on answers of varying length: micro-batches of rows padded to the batch's width, then by
// token count (verl's use_dynamic_bsz) with the budget of one padded micro-batch, so both hold the same
// memory at most. tokens/s counts real tokens (prompts and answers, no padding) in both.
void print_rl_passes(const BenchOptions& o, const Setup& s, CausalLM& model) {
  const RlBatchShape shape{o.rl_rows, o.prompt_length, o.response_length, o.stop_every};
  const int64_t width = o.prompt_length + o.response_length;
  const int64_t budget = o.micro_rows * width;
  const Measurement pass = matmul_bound(s, o.micro_rows * width);
  for (bool train : {false, true}) {
    const int reps = train ? static_cast<int>(o.steps) : 2;
    const RlPassSpeed padded = measure_rl_pass(model, shape, train, o.micro_rows, 0, reps);
    const RlPassSpeed dynamic = measure_rl_pass(model, shape, train, o.micro_rows, budget, reps);
    for (const RlPassSpeed* speed : {&padded, &dynamic}) {
      Measurement m = pass;
      m.what = std::string(train ? "update " : "log-probs ") + (speed == &padded ? "padded" : "dynamic bsz");
      m.batch = o.rl_rows;
      m.tokens_per_s = speed->tokens_per_s();
      const double context = speed->tokens / static_cast<double>(o.rl_rows);
      const double flops = train ? train_flops_per_token(s.config, static_cast<int64_t>(context))
                                 : forward_flops_per_token(s.config, context);
      m.achieved = flops * m.tokens_per_s / 1e9;  // useful work only: padding is not counted
      m.extra = {{"seconds", speed->seconds},
                 {"micro_batches", speed->micro_batches},
                 {"computed_tokens", speed->computed_tokens},
                 {"real_tokens", speed->tokens},
                 {"mean_response", speed->mean_response}};
      if (speed == &dynamic) {
        m.extra["max_token_len"] = budget;
        m.extra["speedup"] = padded.seconds / dynamic.seconds;
      }
      print_measurement(m, o.json);
    }
  }
}

int run_train(const BenchOptions& o) {
  Setup s = setup(o, true, /*roofline_table=*/o.profile.empty());
  CausalLM& model = *s.model;
  const int64_t seq = o.prompt_length + o.response_length;
  if (!o.profile.empty()) {  // one training step per batch under Kineto instead of the speed lines
    const std::vector<int64_t> batches = batches_or(o, {8});
    for (int64_t b : batches) {
      const std::string trace = profile_trace_path(o, b, batches.size());
      print_profile(o, s, "train profile", b, profile_train_step(model, b, seq, trace), trace, {{"seq", seq}});
    }
    return 0;
  }
  // Peak memory comes from libtorch's CPU allocator; tracking is on for every line, so all pay its cost. On a
  // GPU the host's peak says nothing about the step: no peak there.
  const bool host_peak = !s.device.is_cuda();
  if (host_peak) install_cpu_memory_tracking();
  auto measure = [&](int64_t b, int64_t seq) {
    return host_peak ? measure_train_step_and_peak(model, b, seq, o.steps)
                     : TrainStepSpeed{measure_train_step(model, b, seq, o.steps), 0};
  };
  for (int64_t b : batches_or(o, {8})) {
    const TrainStepSpeed plain = measure(b, seq);
    model->set_gradient_checkpointing(true);
    const TrainStepSpeed recomputed = measure(b, seq);
    model->set_gradient_checkpointing(false);
    for (const TrainStepSpeed* speed : {&plain, &recomputed}) {
      Measurement m = matmul_bound(s, b * seq);
      m.what = speed == &plain ? "train" : "train checkpointed";
      m.batch = b;
      m.tokens_per_s = static_cast<double>(b * seq) / speed->seconds;
      // The model's work only: a checkpointed step's recomputed forward pass is not counted.
      m.achieved = train_flops_per_token(s.config, seq) * m.tokens_per_s / 1e9;
      m.extra = {{"seq", seq}, {"step_seconds", speed->seconds}};
      if (host_peak) m.extra["peak_mb"] = static_cast<double>(speed->peak_bytes) / kMB;
      if (speed == &recomputed) {
        m.extra["time_ratio"] = recomputed.seconds / plain.seconds;
        if (host_peak)
          m.extra["memory_ratio"] = static_cast<double>(recomputed.peak_bytes) / static_cast<double>(plain.peak_bytes);
      }
      print_measurement(m, o.json);
    }
  }
  print_rl_passes(o, s, model);
  // The head's log-probs and entropy (forward + backward) a chunk of tokens at a time against whole
  // [tokens, vocab] logits: memory is the figure (the host's allocator: not on a GPU), the unchunked path its
  // baseline.
  for (int64_t vocab : host_peak ? o.logits_vocab : std::vector<int64_t>{}) {
    const HeadLogProbsMemory h = measure_head_log_probs(o.logits_tokens, s.config.hidden_size, vocab, s.dtype);
    Measurement m;
    m.what = "log-probs head memory";
    m.batch = o.logits_tokens;
    m.tokens_per_s = static_cast<double>(o.logits_tokens) / h.chunked_seconds;
    m.units = "MB";
    m.bound_kind = "unchunked";
    m.achieved = static_cast<double>(h.chunked_peak) / kMB;
    m.bound = static_cast<double>(h.full_peak) / kMB;
    m.extra = {{"vocab", vocab},
               {"logits_mb", static_cast<double>(o.logits_tokens * vocab * 4) / kMB},
               {"unchunked_tokens_per_s", static_cast<double>(o.logits_tokens) / h.full_seconds},
               {"time_ratio", h.chunked_seconds / h.full_seconds}};
    print_measurement(m, o.json);
  }
  return 0;
}

// Per-rank memory of the actor's training state and the step time, LoRA adapters of each rank against full
// fine-tuning of the same shape, batch and optimizer, measured in this run.
int run_lora(const BenchOptions& o) {
  const Setup s = setup(o, false, /*roofline_table=*/false);
  for (int64_t r : o.lora_ranks) HF_CHECK(r > 0, "bench lora: --lora-ranks must be positive, got ", r);
  const int64_t batch = batches_or(o, {2}).front(), seq = o.prompt_length + o.response_length;
  HF_CHECK(s.dtype == torch::kFloat32 && s.device.is_cpu(), "bench lora: fp32 on the CPU only (--dtype fp32)");
  if (!o.json)
    std::printf("%lld x %lld tokens, AdamW over the trainable parameters, fp32, step time the best of %lld steps; "
                "MB = 1e6 bytes\n%-10s %12s %10s %10s %10s %10s %8s %9s %8s %10s\n",
                static_cast<long long>(batch), static_cast<long long>(seq), static_cast<long long>(o.steps),
                "training", "trainable", "weights MB", "grads MB", "optim MB", "total MB", "x full", "step s",
                "x full", "peak MB");
  std::vector<int64_t> ranks{0};  // full fine-tuning first: the baseline of every ratio
  ranks.insert(ranks.end(), o.lora_ranks.begin(), o.lora_ranks.end());
  LoraStepMeasurement full;
  for (int64_t rank : ranks) {
    const LoraStepMeasurement m = measure_lora_step(s.config, rank, o.lora_alpha, batch, seq, o.steps);
    if (rank == 0) full = m;
    const auto total = [](const LoraStepMeasurement& x) {
      return static_cast<double>(x.weight_bytes + x.grad_bytes + x.optimizer_bytes);
    };
    const double memory_ratio = total(m) / total(full), time_ratio = m.seconds / full.seconds;
    const std::string what = rank == 0 ? "full" : "lora r=" + std::to_string(rank);
    if (o.json) {
      nlohmann::json line = {{"what", "lora memory"}, {"training", what},  {"lora_rank", rank},
                             {"batch", batch},        {"seq", seq},        {"parameters", m.parameters},
                             {"trainable", m.trainable}, {"weight_bytes", m.weight_bytes},
                             {"grad_bytes", m.grad_bytes}, {"optimizer_bytes", m.optimizer_bytes},
                             {"step_peak_bytes", m.step_peak_bytes}, {"step_seconds", m.seconds},
                             {"memory_ratio", memory_ratio}, {"time_ratio", time_ratio}};
      std::printf("%s\n", line.dump().c_str());
    } else {
      auto mb = [](int64_t bytes) { return static_cast<double>(bytes) / kMB; };
      std::printf("%-10s %12lld %10.1f %10.1f %10.1f %10.1f %8.3f %9.3f %8.2f %10.1f\n", what.c_str(),
                  static_cast<long long>(m.trainable), mb(m.weight_bytes), mb(m.grad_bytes), mb(m.optimizer_bytes),
                  total(m) / kMB, memory_ratio, m.seconds, time_ratio, mb(m.step_peak_bytes));
    }
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

void add_bench_command(CLI::App& app, Action& action) {
  auto opts = std::make_shared<BenchOptions>();
  CLI::App* bench = app.add_subcommand(
      "bench", "Measure throughput on this machine against its measured bandwidth and matmul speed");
  bench->require_subcommand(1);
  CLI::App* machine = bench->add_subcommand("machine", "memory bandwidth (STREAM triad) and the model's matmul GFLOP/s");
  CLI::App* gen = bench->add_subcommand("generate", "decode, prefill and rollout tokens/s through generate()");
  CLI::App* train = bench->add_subcommand("train", "training tokens/s of forward + backward + AdamW");
  CLI::App* lora = bench->add_subcommand(
      "lora", "per-rank weight, gradient and optimizer bytes and step time of LoRA adapters against full fine-tuning");
  for (CLI::App* cmd : {machine, gen, train, lora}) add_common_options(cmd, *opts);
  lora->add_option("--steps", opts->steps, "timed optimizer steps per configuration")->capture_default_str();
  lora->add_option("--lora-ranks", opts->lora_ranks, "adapter ranks measured against full fine-tuning")
      ->delimiter(',')
      ->capture_default_str();
  lora->add_option("--lora-alpha", opts->lora_alpha)->capture_default_str();
  lora->add_option("--preset-layers", opts->preset_layers, "a --preset with this many decoder layers (0 = its own)")
      ->capture_default_str();
  for (CLI::App* cmd : {gen, train})
    cmd->add_option("--device", opts->device, "cpu | cuda (a CUDA build; the bounds are then left to the caller, bound 0)")
        ->capture_default_str();
  gen->add_option("--reps", opts->decode_reps, "timed runs of each decode length (the fastest counts)")
      ->capture_default_str();
  gen->add_option("--profile", opts->profile,
                  "instead of the speed lines: profile --profile-steps decode steps per --batch under Kineto, print a "
                  "per-step summary and write each batch's Chrome trace to this file (FILE.batchB.json for several)");
  train->add_option("--profile", opts->profile,
                    "instead of the speed lines: profile one training step per --batch under Kineto, print a summary "
                    "and write each batch's Chrome trace to this file (FILE.batchB.json for several)");
  gen->add_option("--profile-steps", opts->profile_steps, "decode steps profiled per batch")->capture_default_str();
  gen->add_flag("--rollout-only", opts->rollout_only, "only the rollout lines (no decode and prefill runs first)");
  gen->add_flag("--kept-pools", opts->kept_pools,
                "also time a rollout on the KV pools and CUDA graphs the first one kept (rollout.free_cache_engine: "
                "false), as a \"rollout kept pools\" line");
  machine->add_option("--stream-mb", opts->stream_mb, "MB per triad array (well beyond the caches)")
      ->capture_default_str();
  gen->add_option("--rollout-prompts", opts->rollout_prompts)->capture_default_str();
  gen->add_option("--samples", opts->samples, "samples per rollout prompt")->capture_default_str();
  gen->add_option("--stop-every", opts->stop_every, "every k-th token id stops a rollout sample (p ~ 1/k per step)")
      ->capture_default_str();
  gen->add_option("--max-num-seqs", opts->max_num_seqs,
                  "continuous batching's slots for the rollout (0 = every sequence at once)")
      ->capture_default_str();
  gen->add_option("--admission-rows", opts->admission_rows,
                  "the fewest samples waiting prompts join the running rows with (-1 = a quarter of --max-num-seqs, 0 = "
                  "as soon as a prompt's samples fit)")
      ->capture_default_str();
  gen->add_option("--kv-cache", opts->kv_cache, "continuous batching's KV cache: paged | slots")->capture_default_str();
  gen->add_option("--kv-block-size", opts->kv_block_size, "positions per block of the paged KV cache")
      ->capture_default_str();
  gen->add_option("--max-num-batched-tokens", opts->max_num_batched_tokens,
                  "positions one prefill forward of the rollout holds (rows x longest prompt; the trainer's "
                  "rollout.max_num_batched_tokens)")
      ->capture_default_str();
  gen->add_option("--shared-prefix", opts->shared_prefix,
                  "rollout prompts begin with the same this many ids (a system prompt) before their own "
                  "--prompt-length; > 0 also times the rollout with prefix caching off (\"rollout prefix caching off\")")
      ->capture_default_str();
  gen->add_option("--memory-budget-mb", opts->memory_budget_mb,
                  "the rollout's paged KV pool: --gpu-memory-utilization of this many MB less the weights "
                  "(0 = room for every sequence)")
      ->capture_default_str();
  gen->add_option("--gpu-memory-utilization", opts->gpu_memory_utilization,
                  "fraction of --memory-budget-mb the rollout may use (verl's rollout.gpu_memory_utilization)")
      ->capture_default_str();
  gen->add_flag("--cuda-graphs", opts->cuda_graphs,
                "with --device cuda: replay the paged decode steps as CUDA graphs (the trainer's "
                "rollout.enforce_eager: false)");
  gen->add_option("--readback-interval", opts->readback_interval,
                  "decode steps between two reads of the device: sampled tokens and stop checks stay there in "
                  "between (the trainer's rollout.readback_interval)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  gen->add_flag("--slots-baseline", opts->slots_baseline,
                "with --kv-cache paged, also decode and roll out on the slots (the in-run baseline)");
  gen->add_flag("!--no-static-baseline", opts->static_baseline,
                "skip the rollout on the static batch (the in-run baseline of the rollout's speed-up)");
  train->add_option("--steps", opts->steps, "timed optimizer steps")->capture_default_str();
  train->add_option("--rl-rows", opts->rl_rows, "rows of the RL batch (answers of varying length)")->capture_default_str();
  train->add_option("--micro-rows", opts->micro_rows, "rows per padded RL micro-batch; the token budget is that x width")
      ->capture_default_str();
  train->add_option("--stop-every", opts->stop_every, "RL answers stop with probability 1/k after each token")
      ->capture_default_str();
  train->add_option("--logits-vocab", opts->logits_vocab, "vocabularies of the head memory lines")->delimiter(',');
  train->add_option("--logits-tokens", opts->logits_tokens, "tokens of the head memory lines")->capture_default_str();
  machine->callback([opts, &action] { action = [opts] { return run_machine(*opts); }; });
  gen->callback([opts, &action] { action = [opts] { return run_generate(*opts); }; });
  train->callback([opts, &action] { action = [opts] { return run_train(*opts); }; });
  lora->callback([opts, &action] { action = [opts] { return run_lora(*opts); }; });
}

}  // namespace hybridflow::cli
