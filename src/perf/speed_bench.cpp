// Measures generate() and TrainEngine as the rest of the system calls them; see speed_bench.h.
#include "hybridflow/perf/speed_bench.h"

#include <torch/cuda.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "hybridflow/core/cpu_memory.h"
#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/steady_seconds.h"
#include "hybridflow/engine/decode_graph_cache.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/head_log_probs.h"
#include "hybridflow/engine/model_log_probs.h"
#include "hybridflow/engine/token_micro_batches.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

namespace {

// Token ids 3.. (0-2 are often pad/bos/eos in real vocabularies) from a fixed seed, so runs compare.
std::vector<std::vector<int64_t>> random_prompts(int64_t count, int64_t min_len, int64_t max_len, int64_t vocab,
                                                 uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(count));
  for (auto& p : prompts) {
    p.resize(static_cast<size_t>(min_len + static_cast<int64_t>(rng() % static_cast<uint64_t>(max_len - min_len + 1))));
    for (auto& t : p) t = 3 + static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab - 3));
  }
  return prompts;
}

torch::Device bench_model_device(CausalLM& model) { return model->parameters().front().device(); }

// A GPU runs asynchronously: wait for its queued work before a host clock is read.
void bench_wait_for_device(const torch::Device& device) {
  if (device.is_cuda()) torch::cuda::synchronize(device.index());
}

double time_generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& gen,
                     int reps, GenerationOutput* last = nullptr) {
  double best = 1e300;
  for (int rep = 0; rep < reps; ++rep) {
    const double start = steady_seconds();
    GenerationOutput out = generate(model, prompts, gen);
    bench_wait_for_device(bench_model_device(model));
    best = std::min(best, steady_seconds() - start);
    if (last != nullptr) *last = std::move(out);
  }
  return best;
}

}  // namespace

DecodeSpeed measure_decode(CausalLM& model, int64_t batch, int64_t prompt_length, int64_t response_length, int reps,
                           bool paged_kv_cache, int64_t kv_block_size, bool cuda_graphs,
                           int64_t readback_interval) {
  HF_CHECK(response_length >= 2, "bench: --response-length must be at least 2 to separate decode from prefill, got ",
           response_length);
  HF_CHECK(batch > 0 && prompt_length > 0, "bench: --batch and --prompt-length must be positive");
  const auto prompts = random_prompts(batch, prompt_length, prompt_length, model->config().vocab_size, 1);
  GenerationConfig gen;
  gen.seed = 1;
  gen.eos_token_ids.clear();  // every row decodes every step: fixed work per step
  gen.max_new_tokens = 1;
  gen.paged_kv_cache = paged_kv_cache;
  gen.kv_block_size = kv_block_size;
  gen.cuda_graphs = cuda_graphs;
  gen.readback_interval = readback_interval;
  time_generate(model, prompts, gen, 1);  // warm-up at this batch size
  // Graphs live for one generate() call, which captures its bucket's graph at its first decode step (an eager
  // warm-up step, the capture, the instantiation: a few eager steps' time). With graphs the shorter run
  // therefore decodes that first step too, so that the difference holds replays and no capture.
  const int64_t base = cuda_graphs ? 2 : 1;
  HF_CHECK(response_length > base, "bench: --response-length must be at least ", base + 1,
           " with CUDA graphs to separate decode from prefill and capture, got ", response_length);
  // Decode time is the whole run's less the shorter run's. Both are timed in alternation (a load that
  // comes and goes hits both alike), each the fastest of its reps; should the difference still vanish in
  // the machine's noise (a tiny model, a short response), more rounds are timed, and if it never shows,
  // the measurement fails by name instead of printing an absurd rate.
  double prefill = 1e300, whole = 1e300;
  GenerationOutput out;
  for (int round = 0; round < 4 && (round == 0 || whole - prefill <= 0.05 * whole); ++round) {
    for (int rep = 0; rep < reps; ++rep) {
      gen.max_new_tokens = base;
      prefill = std::min(prefill, time_generate(model, prompts, gen, 1));
      gen.max_new_tokens = response_length;
      whole = std::min(whole, time_generate(model, prompts, gen, 1, &out));
    }
  }
  HF_CHECK(whole - prefill > 0.05 * whole, "bench: decoding ", response_length - base, " tokens at batch ", batch,
           " took no measurable time beyond the prefill (", whole, " s against ", prefill,
           " s); raise --response-length");
  DecodeSpeed speed;
  speed.seconds = whole;
  speed.kv_peak_bytes = out.kv_cache.peak_bytes;
  speed.host_syncs_per_step =
      static_cast<double>(out.host_syncs) / static_cast<double>(std::max<int64_t>(out.decode_steps, 1));
  speed.prefill_tokens_per_s = static_cast<double>(batch * prompt_length) / prefill;
  const double decode = whole - prefill;
  speed.decode_tokens_per_s = static_cast<double>(batch * (response_length - base)) / decode;
  return speed;
}

RolloutSpeed measure_rollout(CausalLM& model, const RolloutOptions& o) {
  HF_CHECK(o.prompts > 0 && o.samples > 0, "bench: rollout prompts and --samples must be positive");
  HF_CHECK(o.stop_every >= 1, "bench: --stop-every must be at least 1, got ", o.stop_every);
  HF_CHECK(o.max_num_seqs >= 0, "bench: --max-num-seqs must be >= 0 (0 = every sequence), got ", o.max_num_seqs);
  const int64_t vocab = model->config().vocab_size;
  HF_CHECK(o.shared_prefix >= 0, "bench: --shared-prefix must be >= 0, got ", o.shared_prefix);
  auto ids = random_prompts(o.prompts, std::max<int64_t>(1, o.prompt_length / 2), o.prompt_length, vocab, 2);
  if (o.shared_prefix > 0) {
    const std::vector<int64_t> shared = random_prompts(1, o.shared_prefix, o.shared_prefix, vocab, 5).front();
    for (auto& p : ids) p.insert(p.begin(), shared.begin(), shared.end());
  }
  GenerationConfig gen;
  gen.seed = 3;
  gen.n = o.samples;
  gen.max_new_tokens = o.max_length;
  gen.continuous_batching = o.continuous;
  gen.max_num_seqs = o.max_num_seqs;
  gen.admission_rows = o.admission_rows;
  gen.paged_kv_cache = o.paged_kv_cache;
  gen.kv_block_size = o.kv_block_size;
  gen.enable_prefix_caching = o.enable_prefix_caching;
  gen.max_num_batched_tokens = o.max_num_batched_tokens;
  gen.memory_budget_bytes = o.memory_budget_bytes;
  gen.gpu_memory_utilization = o.gpu_memory_utilization;
  gen.cuda_graphs = o.cuda_graphs;
  gen.readback_interval = o.readback_interval;
  for (int64_t id = 3; id < vocab; id += o.stop_every) gen.eos_token_ids.push_back(id);
  GenerationOutput out;
  RolloutSpeed speed;
  if (o.kept_pools) {
    gen.decode_graph_cache = std::make_shared<DecodeGraphCache>();
    speed.first_seconds = time_generate(model, ids, gen, 1);
  }
  speed.seconds = time_generate(model, ids, gen, o.reps, &out);
  speed.kept_pools = out.kv_cache.kept_pools;
  speed.decode_graphs = out.decode_graphs;
  speed.graphs_captured = out.decode_graphs - out.decode_graphs_taken;
  speed.graph_steps = out.graph_steps;
  const torch::Tensor lengths = out.response_mask.sum(1);
  speed.rows = lengths.size(0);
  speed.tokens = lengths.sum().item<double>();
  speed.prompt_tokens = out.prompt_mask.sum().item<double>();
  speed.mean_length = speed.tokens / static_cast<double>(speed.rows);
  speed.max_length = lengths.max().item<int64_t>();
  speed.stop_ids = static_cast<int64_t>(gen.eos_token_ids.size());
  speed.kv_cache = out.kv_cache;
  speed.host_syncs = out.host_syncs;
  speed.prefills = out.prefills;
  speed.decode_steps = out.decode_steps;
  return speed;
}

namespace {

// profile (optional): one more step under the profiler, its trace to profile_trace when not empty.
TrainStepSpeed time_train_step(CausalLM& model, int64_t batch, int64_t seq, int64_t steps, bool with_peak,
                               ProfileWindow* profile = nullptr, const std::string& profile_trace = "") {
  HF_CHECK(batch > 0 && seq >= 2 && steps > 0, "bench: training needs --batch > 0, a sequence of at least 2 tokens ",
           "(--prompt-length + --response-length) and --steps > 0");
  model->train();
  OptimizerOptions opt;
  opt.schedule.lr = 1e-4;
  TrainEngine engine(model.ptr(), opt);
  DataProto data;
  torch::manual_seed(1);
  const torch::Device device = bench_model_device(model);
  data.set_tensor("input_ids", torch::randint(3, model->config().vocab_size, {batch, seq}, torch::kLong).to(device));
  auto loss_fn = [&](const DataProto& mb) {
    const auto& input = mb.tensor("input_ids");
    auto logits = model->forward(input, torch::ones_like(input)).logits;
    auto lp = torch::log_softmax(logits.slice(1, 0, seq - 1), -1);
    return -lp.gather(-1, input.slice(1, 1).unsqueeze(-1)).mean();
  };
  auto step = [&] { engine.train_step(data, batch, loss_fn, "", LossWeighting::kRowMean); };
  step();  // warm-up: optimizer state, allocations
  bench_wait_for_device(device);
  TrainStepSpeed speed;
  const double start = steady_seconds();
  for (int64_t i = 0; i < steps; ++i) step();
  bench_wait_for_device(device);
  speed.seconds = (steady_seconds() - start) / static_cast<double>(steps);
  if (with_peak) speed.peak_bytes = peak_cpu_bytes_during(step);
  if (profile != nullptr) {
    const auto drain = [&] { bench_wait_for_device(device); };
    profile_call(step, drain, device.is_cuda());  // the profiler's own first-use costs, outside the figure
    *profile = profile_call(step, drain, device.is_cuda(), profile_trace);
  }
  return speed;
}

// The bench's RL batch (see RlBatchShape), with old log-probs of the model as it is and random advantages.
DataProto rl_batch(CausalLM& model, const RlBatchShape& shape) {
  HF_CHECK(shape.rows > 0 && shape.prompt_length > 0 && shape.response_length > 0 && shape.stop_every >= 1,
           "bench: the RL batch needs rows, --prompt-length, --response-length and --stop-every > 0");
  const int64_t vocab = model->config().vocab_size, p = shape.prompt_length, r = shape.response_length;
  const auto prompts = random_prompts(shape.rows, std::max<int64_t>(1, p / 2), p, vocab, 4);
  std::mt19937_64 rng(5);
  auto prompt_ids = torch::zeros({shape.rows, p}, torch::kLong), prompt_mask = torch::zeros({shape.rows, p}, torch::kLong);
  auto responses = torch::randint(3, vocab, {shape.rows, r}, torch::kLong);
  auto response_mask = torch::zeros({shape.rows, r}, torch::kLong);
  for (int64_t i = 0; i < shape.rows; ++i) {
    const auto& row = prompts[static_cast<size_t>(i)];
    const auto n = static_cast<int64_t>(row.size());
    prompt_ids[i].narrow(0, p - n, n).copy_(torch::tensor(row, torch::kLong));
    prompt_mask[i].narrow(0, p - n, n).fill_(1);
    int64_t length = 1;  // each token after the first continues with probability 1 - 1/stop_every
    while (length < r && rng() % static_cast<uint64_t>(shape.stop_every) != 0) ++length;
    response_mask[i].narrow(0, 0, length).fill_(1);
  }
  responses.masked_fill_(response_mask == 0, 0);
  DataProto b;
  b.set_tensor("prompts", prompt_ids);
  b.set_tensor("responses", responses);
  b.set_tensor("response_mask", response_mask);
  b.set_tensor("input_ids", torch::cat({prompt_ids, responses}, 1));
  b.set_tensor("attention_mask", torch::cat({prompt_mask, response_mask}, 1));
  torch::manual_seed(6);
  b.set_tensor("advantages", torch::randn({shape.rows, r}) * response_mask.to(torch::kFloat));
  b = b.to(bench_model_device(model));  // drawn on the CPU: the same batch on every device
  torch::NoGradGuard no_grad;
  b.set_tensor("old_log_probs",
               response_log_probs(model, b.tensor("input_ids"), b.tensor("attention_mask"), r, 1.0, false).log_probs.detach());
  return b;
}

}  // namespace

double measure_train_step(CausalLM& model, int64_t batch, int64_t seq, int64_t steps) {
  return time_train_step(model, batch, seq, steps, false).seconds;
}

TrainStepSpeed measure_train_step_and_peak(CausalLM& model, int64_t batch, int64_t seq, int64_t steps) {
  return time_train_step(model, batch, seq, steps, true);
}

RlPassSpeed measure_rl_pass(CausalLM& model, const RlBatchShape& shape, bool train, int64_t micro_rows,
                            int64_t max_tokens, int reps) {
  HF_CHECK(reps > 0 && (micro_rows > 0 || max_tokens > 0), "bench: an RL pass needs reps and a micro-batch size");
  const DataProto batch = rl_batch(model, shape);
  const std::vector<MicroBatch> split = split_micro_batches(batch, {micro_rows, max_tokens, "bench token budget"});
  RlPassSpeed speed;
  speed.tokens = batch.tensor("attention_mask").sum().item<double>();
  speed.mean_response = batch.tensor("response_mask").sum().item<double>() / static_cast<double>(shape.rows);
  speed.micro_batches = static_cast<int64_t>(split.size());
  std::vector<DataProto> micro;
  for (const MicroBatch& m : split) {
    speed.computed_tokens += static_cast<double>(m.data.tensor("input_ids").numel());
    micro.push_back(m.data);
  }
  auto log_probs = [&](const DataProto& m, bool entropy) {
    return response_log_probs(model, m.tensor("input_ids"), m.tensor("attention_mask"), m.tensor("responses").size(1),
                              1.0, entropy);
  };
  const torch::Device device = bench_model_device(model);
  if (!train) {
    torch::NoGradGuard no_grad;
    model->eval();
    speed.seconds = 1e300;
    for (int rep = 0; rep <= reps; ++rep) {  // the first is a warm-up
      const double start = steady_seconds();
      for (const DataProto& m : micro) log_probs(m, false);
      bench_wait_for_device(device);
      if (rep > 0) speed.seconds = std::min(speed.seconds, steady_seconds() - start);
    }
    return speed;
  }
  model->train();
  OptimizerOptions opt;
  opt.schedule.lr = 1e-6;
  TrainEngine engine(model.ptr(), opt);
  // PPO's clipped surrogate (token-mean) with an entropy bonus, as the actor's loss computes it.
  auto loss_fn = [&](const DataProto& m) {
    const auto mask = m.tensor("response_mask").to(torch::kFloat);
    const TokenLogProbs lp = log_probs(m, true);
    const auto ratio = (lp.log_probs - m.tensor("old_log_probs")).exp();
    const auto& adv = m.tensor("advantages");
    const auto surrogate = torch::max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2));
    return ((surrogate - 0.001 * lp.entropy) * mask).sum() / mask.sum();
  };
  auto step = [&] { engine.train_step(micro, loss_fn, "response_mask", LossWeighting::kTokenMean); };
  step();  // warm-up: optimizer state, allocations
  bench_wait_for_device(device);
  const double start = steady_seconds();
  for (int rep = 0; rep < reps; ++rep) step();
  bench_wait_for_device(device);
  speed.seconds = (steady_seconds() - start) / reps;
  return speed;
}

HeadLogProbsMemory measure_head_log_probs(int64_t tokens, int64_t hidden, int64_t vocab, torch::Dtype dtype) {
  HF_CHECK(tokens > 0 && hidden > 0 && vocab > 0, "bench: head log-probs need tokens, hidden size and vocabulary > 0");
  torch::manual_seed(7);
  auto h = torch::randn({tokens, hidden}).to(dtype).set_requires_grad(true);
  auto w = (torch::randn({vocab, hidden}) * 0.02).to(dtype).set_requires_grad(true);
  auto targets = torch::randint(0, vocab, {tokens}, torch::kLong);
  auto run = [&](bool chunked, double& seconds) {
    h.mutable_grad() = torch::Tensor();
    w.mutable_grad() = torch::Tensor();
    return peak_cpu_bytes_during([&] {
      const double start = steady_seconds();
      const TokenLogProbs out =
          chunked ? head_log_probs(h, w, targets)
                  : token_log_probs(torch::linear(h, w).to(torch::kFloat32).unsqueeze(0), targets.unsqueeze(0));
      (out.log_probs.sum() + out.entropy.sum()).backward();
      seconds = steady_seconds() - start;
    });
  };
  HeadLogProbsMemory m;
  m.chunked_peak = run(true, m.chunked_seconds);
  m.full_peak = run(false, m.full_seconds);
  return m;
}

ProfileStepSummary profile_train_step(CausalLM& model, int64_t batch, int64_t seq, const std::string& trace_path) {
  ProfileWindow window;
  time_train_step(model, batch, seq, 1, false, &window, trace_path);
  return per_step_difference(window, ProfileWindow{}, 1);
}

DecodeProfile profile_decode(CausalLM& model, int64_t batch, int64_t prompt_length, int64_t steps, bool paged_kv_cache,
                             int64_t kv_block_size, const std::string& trace_path, bool cuda_graphs,
                             int64_t readback_interval) {
  HF_CHECK(steps >= 1, "bench: --profile-steps must be at least 1, got ", steps);
  HF_CHECK(batch > 0 && prompt_length > 0, "bench: --batch and --prompt-length must be positive");
  const auto prompts = random_prompts(batch, prompt_length, prompt_length, model->config().vocab_size, 1);
  GenerationConfig gen;
  gen.seed = 1;
  gen.eos_token_ids.clear();  // every row decodes every step, as in measure_decode
  gen.paged_kv_cache = paged_kv_cache;
  gen.kv_block_size = kv_block_size;
  gen.cuda_graphs = cuda_graphs;
  gen.readback_interval = readback_interval;
  // Graphs live for one generate() call, which captures its bucket's graph at its first decode step: with
  // graphs both profiled runs decode that first step (capture, warm-up and a replay), so that the difference
  // holds `steps` replays and no capture. (The prompts' span stays in one bucket over so few steps.)
  const int64_t base = cuda_graphs ? 2 : 1;
  gen.max_new_tokens = base + steps;
  time_generate(model, prompts, gen, 1);  // warm-up at this batch size, outside the profile
  const torch::Device device = bench_model_device(model);
  auto run = [&](int64_t new_tokens, const std::string& trace) {
    gen.max_new_tokens = new_tokens;
    GenerationOutput out;
    ProfileWindow window = profile_call([&] { out = generate(model, prompts, gen); },
                                        [&] { bench_wait_for_device(device); }, device.is_cuda(), trace);
    return std::make_pair(window, out.graph_steps);
  };
  run(base, "");  // the first profiled call pays the profiler's own first-use costs: not in either figure
  const auto [prefill, base_replays] = run(base, "");
  const auto [whole, whole_replays] = run(base + steps, trace_path);
  DecodeProfile profile;
  profile.per_step = per_step_difference(whole, prefill, steps);
  profile.prefill_seconds = prefill.wall_seconds;
  profile.graph_steps = whole_replays - base_replays;
  return profile;
}

}  // namespace hybridflow
