// Measures generate() and TrainEngine as the rest of the system calls them; see speed_bench.h.
#include "hybridflow/engine/speed_bench.h"

#include <algorithm>
#include <chrono>
#include <random>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/core/error.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/engine/train_engine.h"

namespace hybridflow {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

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

double time_generate(CausalLM& model, const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& gen,
                     int reps, GenerationOutput* last = nullptr) {
  double best = 1e300;
  for (int rep = 0; rep < reps; ++rep) {
    const double start = now_seconds();
    GenerationOutput out = generate(model, prompts, gen);
    best = std::min(best, now_seconds() - start);
    if (last != nullptr) *last = std::move(out);
  }
  return best;
}

}  // namespace

DecodeSpeed measure_decode(CausalLM& model, int64_t batch, int64_t prompt_length, int64_t response_length, int reps) {
  HF_CHECK(response_length >= 2, "bench: --response-length must be at least 2 to separate decode from prefill, got ",
           response_length);
  HF_CHECK(batch > 0 && prompt_length > 0, "bench: --batch and --prompt-length must be positive");
  const auto prompts = random_prompts(batch, prompt_length, prompt_length, model->config().vocab_size, 1);
  GenerationConfig gen;
  gen.seed = 1;
  gen.eos_token_ids.clear();  // every row decodes every step: fixed work per step
  gen.max_new_tokens = 1;
  time_generate(model, prompts, gen, 1);  // warm-up at this batch size
  const double prefill = time_generate(model, prompts, gen, reps);
  gen.max_new_tokens = response_length;
  const double whole = time_generate(model, prompts, gen, reps);
  DecodeSpeed speed;
  speed.seconds = whole;
  speed.prefill_tokens_per_s = static_cast<double>(batch * prompt_length) / prefill;
  // A loaded machine can make the difference vanish; never report a negative or infinite rate.
  const double decode = std::max(whole - prefill, 1e-9);
  speed.decode_tokens_per_s = static_cast<double>(batch * (response_length - 1)) / decode;
  return speed;
}

RolloutSpeed measure_rollout(CausalLM& model, const RolloutOptions& o) {
  HF_CHECK(o.prompts > 0 && o.samples > 0, "bench: rollout prompts and --samples must be positive");
  HF_CHECK(o.stop_every >= 1, "bench: --stop-every must be at least 1, got ", o.stop_every);
  HF_CHECK(o.max_num_seqs >= 0, "bench: --max-num-seqs must be >= 0 (0 = every sequence), got ", o.max_num_seqs);
  const int64_t vocab = model->config().vocab_size;
  const auto ids = random_prompts(o.prompts, std::max<int64_t>(1, o.prompt_length / 2), o.prompt_length, vocab, 2);
  GenerationConfig gen;
  gen.seed = 3;
  gen.n = o.samples;
  gen.max_new_tokens = o.max_length;
  gen.continuous_batching = o.continuous;
  gen.max_num_seqs = o.max_num_seqs;
  for (int64_t id = 3; id < vocab; id += o.stop_every) gen.eos_token_ids.push_back(id);
  GenerationOutput out;
  RolloutSpeed speed;
  speed.seconds = time_generate(model, ids, gen, o.reps, &out);
  const torch::Tensor lengths = out.response_mask.sum(1);
  speed.rows = lengths.size(0);
  speed.tokens = lengths.sum().item<double>();
  speed.prompt_tokens = out.prompt_mask.sum().item<double>();
  speed.mean_length = speed.tokens / static_cast<double>(speed.rows);
  speed.max_length = lengths.max().item<int64_t>();
  speed.stop_ids = static_cast<int64_t>(gen.eos_token_ids.size());
  return speed;
}

double measure_train_step(CausalLM& model, int64_t batch, int64_t seq, int64_t steps) {
  HF_CHECK(batch > 0 && seq >= 2 && steps > 0, "bench: training needs --batch > 0, a sequence of at least 2 tokens ",
           "(--prompt-length + --response-length) and --steps > 0");
  model->train();
  OptimizerOptions opt;
  opt.schedule.lr = 1e-4;
  TrainEngine engine(model.ptr(), opt);
  DataProto data;
  torch::manual_seed(1);
  data.set_tensor("input_ids", torch::randint(3, model->config().vocab_size, {batch, seq}, torch::kLong));
  auto loss_fn = [&](const DataProto& mb) {
    const auto& input = mb.tensor("input_ids");
    auto logits = model->forward(input, torch::ones_like(input)).logits;
    auto lp = torch::log_softmax(logits.slice(1, 0, seq - 1), -1);
    return -lp.gather(-1, input.slice(1, 1).unsqueeze(-1)).mean();
  };
  engine.train_step(data, batch, loss_fn, "", LossWeighting::kRowMean);  // warm-up: optimizer state, allocations
  const double start = now_seconds();
  for (int64_t i = 0; i < steps; ++i) engine.train_step(data, batch, loss_fn, "", LossWeighting::kRowMean);
  return (now_seconds() - start) / static_cast<double>(steps);
}

}  // namespace hybridflow
