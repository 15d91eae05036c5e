// The host's work per paged decode step outside the model, as the continuous generator does it with CUDA
// graphs: one block-manager append per row, then the graph's padded static input (tokens, lengths, block
// tables) written into the buffer that is uploaded. Two ways, timed in alternation in one run:
//   copies: each row's table copied into a vector of vectors, padded by DecodeGraphPlan::pad into three
//           vectors, then copied into the upload buffer (the generator's way until the pointers below);
//   in place: pointers to the block manager's own tables, written once into the upload buffer
//           (DecodeGraphPlan::write_padded).
// The device work of a step (the copies, the replay) is not here: this measures what a CPU-only machine can.
// Then the whole decode step through generate() with a model so small (1 layer, hidden 16, vocabulary 64)
// that the step is mostly the host's bookkeeping and libtorch's per-operator cost: the continuous generator
// on the paged cache, read back every 8 steps, the CPU time of the calling thread (one intra-op thread, so a
// loaded machine's waits do not count) per decode step, from runs of 1 and 1 + steps new tokens.
//   bench_decode_host [--batch=1,64,256] [--prompt=992] [--steps=32] [--block=16] [--reps=20] [--generate-reps=8]
#include <time.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <vector>

#include "bench_common.h"
#include "hybridflow/engine/block_manager.h"
#include "hybridflow/engine/decode_graph_plan.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/transformer.h"

using namespace hybridflow;

namespace {

struct DecodeHostRun {
  int64_t rows = 1, prompt = 992, steps = 32, block = 16;
};

// Seconds per decode step of `steps` steps for `rows` sequences of `prompt` tokens, the step's inputs built
// the old way (copies) or in place.
double seconds_per_step(const DecodeHostRun& run, bool in_place) {
  const int64_t most = run.prompt + run.steps;
  BlockManager blocks(run.rows * ((most + run.block - 1) / run.block + 1), run.block);
  std::vector<int64_t> sequences, lengths, tokens;
  for (int64_t r = 0; r < run.rows; ++r) {
    sequences.push_back(blocks.admit(run.prompt, 1, most).front());
    lengths.push_back(run.prompt);
    tokens.push_back(3 + r % 61);
  }
  const DecodeGraphPlan plan({.block_size = run.block, .max_rows = 512, .max_span = most});
  std::vector<int64_t> upload;
  std::vector<const std::vector<int64_t>*> refs;
  int64_t checksum = 0;
  const double start = bench::now_seconds();
  for (int64_t k = 0; k < run.steps; ++k) {
    int64_t longest = 1;
    for (int64_t length : lengths) longest = std::max(longest, length + 1);
    const DecodeGraphBucket bucket = plan.bucket(run.rows, longest);
    const int64_t n = bucket.rows, width = bucket.span / run.block;
    upload.resize(static_cast<size_t>(n * (2 + width)));
    if (in_place) {
      refs.clear();
      for (int64_t sequence : sequences) {
        blocks.append(sequence);
        refs.push_back(&blocks.table(sequence));
      }
      plan.write_padded(bucket, nullptr, refs, lengths, 0, 0, upload.data());
    } else {
      std::vector<std::vector<int64_t>> tables;
      for (int64_t sequence : sequences) {
        blocks.append(sequence);
        tables.push_back(blocks.table(sequence));
      }
      const PaddedDecodeStep step =
          plan.pad(bucket, std::vector<int64_t>(static_cast<size_t>(run.rows), 0), tables, lengths, 0, 0);
      std::copy(step.tokens.begin(), step.tokens.end(), upload.begin());
      std::copy(step.lengths.begin(), step.lengths.end(), upload.begin() + n);
      std::copy(step.tables.begin(), step.tables.end(), upload.begin() + 2 * n);
    }
    checksum += upload[static_cast<size_t>(2 * n)];
    for (int64_t& length : lengths) ++length;
  }
  const double seconds = bench::now_seconds() - start;
  if (checksum < 0) std::printf("impossible\n");  // keeps the writes observable
  return seconds / static_cast<double>(run.steps);
}

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Thread CPU seconds per decode step of generate() for `rows` prompts of run.prompt tokens: the fastest of
// `reps` runs of 1 + run.steps new tokens less the fastest of as many of 1 (the prefill and first draw).
double generate_cpu_seconds_per_step(CausalLM& model, const DecodeHostRun& run, int64_t reps) {
  std::vector<std::vector<int64_t>> prompts(static_cast<size_t>(run.rows));
  for (size_t r = 0; r < prompts.size(); ++r)
    for (int64_t t = 0; t < run.prompt; ++t) prompts[r].push_back(3 + static_cast<int64_t>((r * 7 + t * 13) % 61));
  GenerationConfig gen;
  gen.seed = 1;
  gen.eos_token_ids.clear();  // every row decodes every step
  gen.paged_kv_cache = true;
  gen.kv_block_size = run.block;
  gen.readback_interval = 8;
  double prefill = 1e300, whole = 1e300;
  for (int64_t rep = 0; rep < reps; ++rep)
    for (int64_t tokens : {int64_t{1}, 1 + run.steps}) {
      gen.max_new_tokens = tokens;
      const double start = thread_cpu_seconds();
      generate(model, prompts, gen);
      const double seconds = thread_cpu_seconds() - start;
      double& best = tokens == 1 ? prefill : whole;
      best = std::min(best, seconds);
    }
  return (whole - prefill) / static_cast<double>(run.steps);
}

std::vector<int64_t> batches_from(const std::string& list) {
  std::vector<int64_t> out;
  std::stringstream in(list);
  for (std::string item; std::getline(in, item, ',');) out.push_back(std::stoll(item));
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  DecodeHostRun run;
  run.prompt = bench::arg_int(argc, argv, "prompt", 992);
  run.steps = bench::arg_int(argc, argv, "steps", 32);
  run.block = bench::arg_int(argc, argv, "block", 16);
  const int64_t reps = bench::arg_int(argc, argv, "reps", 20);
  std::printf("decode step host work (block appends + the graph's padded input), %lld-token prompts, %lld steps, "
              "blocks of %lld; the fastest of %lld runs each, timed in alternation\n",
              static_cast<long long>(run.prompt), static_cast<long long>(run.steps), static_cast<long long>(run.block),
              static_cast<long long>(reps));
  std::printf("%8s %16s %16s %10s\n", "batch", "copies us/step", "in place us/step", "speed-up");
  for (int64_t rows : batches_from(bench::arg(argc, argv, "batch", "1,64,256"))) {
    run.rows = rows;
    double copies = 1e300, in_place = 1e300;
    for (int64_t rep = 0; rep < reps; ++rep) {
      copies = std::min(copies, seconds_per_step(run, false));
      in_place = std::min(in_place, seconds_per_step(run, true));
    }
    std::printf("%8lld %16.2f %16.2f %9.2fx\n", static_cast<long long>(rows), copies * 1e6, in_place * 1e6,
                copies / in_place);
  }

  at::set_num_threads(1);
  ModelConfig config;
  config.vocab_size = 64;
  config.hidden_size = 16;
  config.intermediate_size = 16;
  config.num_hidden_layers = 1;
  config.num_attention_heads = 1;
  config.num_key_value_heads = 1;
  config.max_position_embeddings = 4096;
  torch::manual_seed(0);
  CausalLM model(config);
  model->eval();
  const int64_t generate_reps = bench::arg_int(argc, argv, "generate-reps", 8);
  std::printf("\ngenerate(), 1 layer, hidden 16, vocabulary 64, paged cache, read back every 8 steps, 1 thread: "
              "thread CPU us per decode step, the fastest of %lld runs\n",
              static_cast<long long>(generate_reps));
  std::printf("%8s %12s\n", "batch", "us/step");
  for (int64_t rows : batches_from(bench::arg(argc, argv, "batch", "1,64,256"))) {
    run.rows = rows;
    std::printf("%8lld %12.1f\n", static_cast<long long>(rows),
                generate_cpu_seconds_per_step(model, run, generate_reps) * 1e6);
    std::fflush(stdout);
  }
  return 0;
}
