// Ulysses sequence parallelism at long sequences: sequences of 4k, 16k and 32k tokens (by default) through the
// actor's compute_log_prob (forward) and update_actor (forward + backward of the response log-probs and AdamW,
// one optimizer step) on groups of 1, 2 and 4 processes that split each sequence
// (actor.ulysses_sequence_parallel_size), the "small" preset (hidden 256, 8 heads over 4 KV heads,
// intermediate 688, 4 layers; --vocab 1024, --layers to change). A group of n takes a batch of n sequences (the
// controller hands each member one, the group gathers them) in micro-batches of one sequence, so every
// configuration's peak is that of one sequence's pass, split n ways; times are per sequence.
// Each (length, size) gets fresh worker processes through the Controller, 1 thread each, so every process's
// resident high-water mark (VmHWM, memory_stats) is that configuration's alone. Reported per configuration:
// both call times, the peak RSS of the largest rank, its part above the rank's RSS right after the model was
// built (activations and their gradients, optimizer state, the head's logits), and that part against 1 process;
// per line also the peak after the forward alone and the resident set after each call. Resident memory includes
// what glibc's malloc keeps after a free: with MALLOC_MMAP_THRESHOLD_=131072 in the environment (the workers
// inherit it) large tensors are unmapped when freed and the peaks follow the live tensors (docs/performance.md).
// The ranks share this machine's cores: with fewer cores than ranks the times show the all-to-all's cost and
// the oversubscription, not a speed-up; memory per rank is what sequence parallelism buys.
// --mask-hole=1 masks one prompt position (a hole in the attention mask), which sends attention through the
// additive [B, 1, T, S] mask, as every pass did before the causal layouts (model/transformer.cpp): the baseline.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <tuple>
#include <vector>

#include "bench_common.h"
#include "hybridflow/core/error.h"
#include "hybridflow/runtime/controller.h"
#include "hybridflow/runtime/worker_main.h"
#include "hybridflow/workers/rl_workers.h"

using namespace hybridflow;

namespace {

std::vector<int64_t> int_list(const std::string& text, const char* what) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    const long long v = std::atoll(item.c_str());
    HF_CHECK(v > 0, "bench_sequence_parallel: --", what, " takes positive integers separated by commas, got '",
             text, "'");
    out.push_back(v);
  }
  return out;
}

// The largest rank's resident set: its peak and its current size.
std::pair<double, double> largest_rank_rss(WorkerGroup& group) {
  double peak = 0, rss = 0;
  const Future reply = group.call("memory_stats");  // per_rank() refers into it
  for (const DataProto& rank : reply.per_rank()) {
    peak = std::max(peak, static_cast<double>(rank.tensor("peak_rss_bytes")[0].item<int64_t>()));
    rss = std::max(rss, static_cast<double>(rank.tensor("rss_bytes")[0].item<int64_t>()));
  }
  return {peak, rss};
}

struct Row {
  int64_t length = 0, sp = 0;
  double forward_s = 0, step_s = 0, peak = 0, base = 0;
  // The peak after compute_log_prob alone (VmHWM only grows, so peak - forward_peak is what the training step
  // added on top), and the resident set left after each call (memory the allocator kept, not returned).
  double forward_peak = 0, forward_rss = 0, step_rss = 0;
};

}  // namespace

int main(int argc, char** argv) {
  register_rl_workers();
  run_worker_if_requested();
  const auto lengths = int_list(bench::arg(argc, argv, "lengths", "4096,16384,32768"), "lengths");
  const auto sizes = int_list(bench::arg(argc, argv, "sp", "1,2,4"), "sp");
  const int64_t prompt = bench::arg_int(argc, argv, "prompt", 256);
  const int64_t vocab = bench::arg_int(argc, argv, "vocab", 1024);
  const int64_t layers = bench::arg_int(argc, argv, "layers", 4);
  const bool mask_hole = bench::arg_int(argc, argv, "mask-hole", 0) != 0;
  at::set_num_threads(1);

  std::vector<Row> rows;
  int64_t params = 0;
  for (int64_t length : lengths) {
    HF_CHECK(length > prompt, "bench_sequence_parallel: --lengths must exceed --prompt (", prompt, ")");
    const int64_t response = length - prompt;
    torch::manual_seed(0);
    DataProto one;
    auto ids = torch::randint(3, vocab, {1, length}, torch::kLong);
    one.set_tensor("input_ids", ids);
    auto mask = torch::ones_like(ids);
    if (mask_hole) mask[0][1] = 0;
    one.set_tensor("attention_mask", mask);
    one.set_tensor("responses", ids.slice(1, prompt).contiguous());
    one.set_tensor("response_mask", torch::ones({1, response}, torch::kLong));
    one.set_tensor("advantages", torch::randn({1, response}));
    for (int64_t sp : sizes) {
      DataProto batch;
      for (const auto& [name, t] : one.tensors()) batch.set_tensor(name, t.repeat({sp, 1}));
      ResourcePool pool;
      pool.name = "sp" + std::to_string(sp);
      pool.num_processes = static_cast<int>(sp);
      pool.env["OMP_NUM_THREADS"] = "1";
      pool.env["OMP_WAIT_POLICY"] = "passive";
      const nlohmann::json config = {
          {"model",
           {{"preset", "small"}, {"vocab_size", vocab}, {"num_hidden_layers", layers}, {"init_seed", 1},
            {"eos_token_id", 2}, {"pad_token_id", 0}, {"ulysses_sequence_parallel_size", sp}}},
          {"actor", {{"lr", 1e-4}, {"mini_batch_rows", 0}, {"micro_batch_rows", 1}, {"epochs", 1}, {"shuffle", false}}},
          {"rollout", {{"response_length", response}, {"log_prob_micro_batch_size", 1}}}};
      Controller ctl;  // fresh processes: each configuration's high-water mark is its own
      ctl.add_pools({pool});
      WorkerGroup actor = ctl.create_group(pool.name, "actor", kActorRolloutRefWorkerType, {}, config);
      if (params == 0) {  // every rank holds the whole model: count one rank's copy, not the group's concatenation
        const Future reply = actor.call("flat_parameters");
        params = reply.per_rank().front().tensor("parameters").numel();
      }
      Row row{length, sp};
      row.base = largest_rank_rss(actor).second;
      DataProto step = batch;
      double start = bench::now_seconds();
      step.update(actor.call("compute_log_prob", step).get());
      row.forward_s = (bench::now_seconds() - start) / static_cast<double>(sp);
      std::tie(row.forward_peak, row.forward_rss) = largest_rank_rss(actor);
      start = bench::now_seconds();
      actor.call("update_actor", step).get();
      row.step_s = (bench::now_seconds() - start) / static_cast<double>(sp);
      std::tie(row.peak, row.step_rss) = largest_rank_rss(actor);
      rows.push_back(row);
      constexpr double kMiB = 1 << 20;
      std::printf("%6lld tokens, SP %lld: per sequence forward %.1f s, training step %.1f s, peak RSS %.0f MiB (%.0f MiB above "
                  "the built model; after the forward: peak %.0f, RSS %.0f; RSS after the step %.0f)\n",
                  static_cast<long long>(length), static_cast<long long>(sp), row.forward_s, row.step_s, row.peak / kMiB,
                  (row.peak - row.base) / kMiB, (row.forward_peak - row.base) / kMiB, (row.forward_rss - row.base) / kMiB,
                  (row.step_rss - row.base) / kMiB);
      std::fflush(stdout);
    }
  }
  std::printf("\nSequences of %lld prompt tokens + the rest response, micro-batches of one sequence, %lld parameters (preset small, %lld layers, "
              "vocabulary %lld), fp32, 1 thread per rank%s\n",
              static_cast<long long>(prompt), static_cast<long long>(params), static_cast<long long>(layers),
              static_cast<long long>(vocab), mask_hole ? ", attention through the additive mask (--mask-hole)" : "");
  std::printf("| tokens | SP | forward (log-probs) s per sequence | training step s per sequence | peak RSS per rank MiB | above the built model "
              "MiB | vs SP 1 |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  for (const Row& r : rows) {
    const auto one = std::find_if(rows.begin(), rows.end(), [&](const Row& o) { return o.length == r.length && o.sp == 1; });
    const double above = r.peak - r.base;
    std::printf("| %lld | %lld | %.1f | %.1f | %.0f | %.0f | ", static_cast<long long>(r.length),
                static_cast<long long>(r.sp), r.forward_s, r.step_s, r.peak / (1 << 20), above / (1 << 20));
    if (one != rows.end()) std::printf("%.2fx |\n", above / (one->peak - one->base));
    else std::printf("- |\n");
  }
  return 0;
}
