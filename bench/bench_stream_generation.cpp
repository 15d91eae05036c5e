// A rollout pool's throughput when its batches' responses vary in length: one generate call per batch (the
// batch's slots idle while its longest samples finish) against one streaming call into which every later
// batch's prompts are admitted as slots free (GenerationConfig::next_prompts), each group handed out as it
// ends. Both draw the same tokens (a streamed prompt keeps its batch's seed and sequence numbers); the bench
// checks that, then alternates the two modes and prints samples per second, per round and the median.
//   bench_stream_generation [--preset=tiny] [--vocab=16] [--batches=20] [--batch=16] [--n=4]
//                           [--new-tokens=28] [--max-num-seqs=8] [--rounds=5] [--threads=1]
// Prompts are 2 to 25 tokens; a response ends at its first eos (id 2, about one draw in `vocab` from a
// freshly initialised model) or at new-tokens, so lengths vary about as the sort example's do.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "bench_common.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

namespace {

struct Timed {
  double seconds = 0.0;
  int64_t response_tokens = 0, decode_steps = 0;
  std::vector<std::vector<int64_t>> tokens;  // per sample, batch after batch
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

void append_rows(const GenerationOutput& out, int64_t first, int64_t count, Timed& into) {
  for (int64_t q = first; q < first + count; ++q) {
    const int64_t len = out.response_mask[q].sum().item<int64_t>();
    const auto r = out.responses[q].slice(0, 0, len).contiguous();
    into.tokens.emplace_back(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + len);
    into.response_tokens += len;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const auto option = [&](const char* name, long long fallback) {
    return static_cast<int64_t>(bench::arg_int(argc, argv, name, fallback));
  };
  const std::string preset = bench::arg(argc, argv, "preset", "tiny");
  const int64_t vocab = option("vocab", 16), batches = option("batches", 20), batch = option("batch", 16);
  const int64_t n = option("n", 4), rounds = option("rounds", 5);
  init_threads(static_cast<int>(option("threads", 1)));

  const ModelConfig config = preset_model_config(preset, vocab);
  torch::manual_seed(0);
  CausalLM model(config);
  model->eval();

  std::mt19937_64 rng(0);
  std::vector<std::vector<std::vector<int64_t>>> prompts(static_cast<size_t>(batches));
  for (auto& b : prompts) {
    b.resize(static_cast<size_t>(batch));
    for (auto& p : b) {
      p.resize(2 + rng() % 24);
      for (auto& t : p) t = 3 + static_cast<int64_t>(rng() % static_cast<uint64_t>(vocab - 3));
    }
  }
  GenerationConfig base;
  base.max_new_tokens = option("new-tokens", 28);
  base.max_num_seqs = option("max-num-seqs", 8);
  base.n = n;
  base.eos_token_ids = {2};
  const auto seed_of = [](int64_t b) { return static_cast<uint64_t>(1000 + b); };

  const auto batch_at_a_time = [&] {
    Timed t;
    const double start = bench::now_seconds();
    for (int64_t b = 0; b < batches; ++b) {
      GenerationConfig g = base;
      g.seed = seed_of(b);
      const GenerationOutput out = generate(model, prompts[static_cast<size_t>(b)], g);
      t.decode_steps += out.decode_steps;
      append_rows(out, 0, batch * n, t);
    }
    t.seconds = bench::now_seconds() - start;
    return t;
  };
  const auto streaming = [&] {
    Timed t;
    GenerationConfig g = base;
    g.seed = seed_of(0);
    g.max_prompt_length = 25;
    int64_t next = batch;  // the prompts after batch 0, in order
    g.next_prompts = [&](int64_t room, bool) {
      std::vector<StreamedPrompt> more;
      for (int64_t k = 0; k < room && next < batches * batch; ++k, ++next) {
        const int64_t b = next / batch, i = next % batch;
        more.push_back({prompts[static_cast<size_t>(b)][static_cast<size_t>(i)], seed_of(b), i * n});
      }
      return more;
    };
    int64_t groups = 0;
    g.on_group_finished = [&groups](FinishedGroup&&) { ++groups; };
    const double start = bench::now_seconds();
    const GenerationOutput out = generate(model, prompts[0], g);
    t.seconds = bench::now_seconds() - start;
    if (groups != batches * batch) std::printf("  error: %lld groups handed out\n", static_cast<long long>(groups));
    t.decode_steps = out.decode_steps;
    append_rows(out, 0, batches * batch * n, t);
    return t;
  };

  batch_at_a_time();  // warm-up
  const Timed check_batch = batch_at_a_time(), check_stream = streaming();
  const bool same = check_batch.tokens == check_stream.tokens;
  const double samples = static_cast<double>(batches * batch * n);
  std::printf("stream generation: preset %s (%lld parameters, vocabulary %lld), %lld batches of %lld prompts x n %lld, "
              "max_num_seqs %lld, up to %lld new tokens, %d thread(s)\n",
              preset.c_str(), static_cast<long long>(config.num_parameters()), static_cast<long long>(vocab),
              static_cast<long long>(batches), static_cast<long long>(batch), static_cast<long long>(n),
              static_cast<long long>(base.max_num_seqs), static_cast<long long>(base.max_new_tokens),
              at::get_num_threads());
  std::printf("  mean response %.1f tokens; same tokens in both modes: %s\n",
              static_cast<double>(check_batch.response_tokens) / samples, same ? "yes" : "NO");
  std::printf("  rows per decode step: batch at a time %.2f, streaming %.2f (of %lld slots)\n",
              static_cast<double>(check_batch.response_tokens) / static_cast<double>(check_batch.decode_steps),
              static_cast<double>(check_stream.response_tokens) / static_cast<double>(check_stream.decode_steps),
              static_cast<long long>(base.max_num_seqs));
  std::vector<double> batch_rates, stream_rates, ratios;
  for (int64_t r = 0; r < rounds; ++r) {
    // Alternate which mode goes first, so that a drift in the machine's load falls on both.
    Timed a, s;
    if (r % 2 == 0) {
      a = batch_at_a_time();
      s = streaming();
    } else {
      s = streaming();
      a = batch_at_a_time();
    }
    batch_rates.push_back(samples / a.seconds);
    stream_rates.push_back(samples / s.seconds);
    ratios.push_back(a.seconds / s.seconds);
    std::printf("  round %lld: batch at a time %.1f samples/s (%.2f s), streaming %.1f samples/s (%.2f s), %.2fx\n",
                static_cast<long long>(r + 1), batch_rates.back(), a.seconds, stream_rates.back(), s.seconds,
                ratios.back());
  }
  std::printf("  median: batch at a time %.1f samples/s, streaming %.1f samples/s, per-round ratio %.2fx\n",
              median(batch_rates), median(stream_rates), median(ratios));
  return same ? 0 : 1;
}
