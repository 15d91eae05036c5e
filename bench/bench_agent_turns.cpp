// Multi-turn agentic rollouts: turns generated in rounds (every turn prefills its whole context again, a round
// waits for the slowest tool) against continuous batching of turns (a turn resumes from its conversation's
// cached prefix with a delta prefill, and decodes beside the others' turns). Same model, rows, tools and seed
// for both, alternated in one run; prints the positions prefilled and the wall time of each rollout, and the
// ratios (of the summed positions and of the median times). A third path, continuous batching with each
// prompt's n episodes sharing its KV blocks and prefill, against the second without sharing: the positions
// prefilled and the peak of KV blocks held. A fourth, the third with prefix caching across prompts (the
// default: a prompt starts on the blocks of another prompt's identical beginning, the system prompt and the
// tools' schema) against the third without it. Only the fourth caches prefixes across prompts. A fifth, the
// fourth with every prefill run alone (max_num_batched_tokens 1) against the fourth, which prefills the turns a
// step starts together: the forwards that prefilled and the generating time.
//   bench_agent_turns --model=DIR --tokenizer=DIR --tools=FILE --data=FILE [--questions=8] [--n=8]
//       [--response-length=112] [--max-assistant-turns=2] [--temperature=1.0] [--repeats=3] [--threads=0]
//       [--block-size=16] [--system=FILE] [--paths=0,1,2,3,4]
// --system: a system message (the file's text) put before every row's messages, as a dataset's shared
// instructions are. --paths: which paths run (the ratios of paths that did not run print as nan).
// examples/calculator_tool/run.sh makes the model (runs/calculator/sft/final), the tokenizer
// (runs/calculator/tokenizer) and the rows (runs/calculator/test.jsonl); the tools are
// examples/calculator_tool/tools.yaml.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "bench_common.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/heap_reuse.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/workers/agent_rollout.h"

using namespace hybridflow;

int main(int argc, char** argv) {
  keep_freed_heap_for_reuse();  // as the hybridflow binary does (core/heap_reuse.h)
  const std::string model_dir = bench::arg(argc, argv, "model", "runs/calculator/sft/final");
  const std::string tokenizer_dir = bench::arg(argc, argv, "tokenizer", "runs/calculator/tokenizer");
  const std::string tools = bench::arg(argc, argv, "tools", "examples/calculator_tool/tools.yaml");
  const std::string data = bench::arg(argc, argv, "data", "runs/calculator/test.jsonl");
  const int64_t questions = bench::arg_int(argc, argv, "questions", 8);
  const int64_t repeats = bench::arg_int(argc, argv, "repeats", 3);
  const std::string system_file = bench::arg(argc, argv, "system", "");
  std::string system_text;
  if (!system_file.empty()) {
    std::ifstream in(system_file);
    HF_CHECK(in.good(), "bench_agent_turns: cannot read --system=", system_file);
    system_text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  init_threads(static_cast<int>(bench::arg_int(argc, argv, "threads", 0)));

  Pretrained pretrained = load_pretrained(model_dir);
  CausalLM model = pretrained.model;
  model->eval();
  const nlohmann::json multi_turn = {
      {"tokenizer_dir", tokenizer_dir},
      {"tool_config_path", tools},
      {"format", "hermes"},
      {"max_assistant_turns", bench::arg_int(argc, argv, "max-assistant-turns", 2)},
      {"max_user_turns", 0},
      {"max_parallel_calls", 1}};
  AgentRolloutRuntime runtime(multi_turn);
  AgentRolloutContext context = runtime.context();

  DataProto prompts;
  {
    std::ifstream in(data);
    HF_CHECK(in.good(), "bench_agent_turns: cannot read --data=", data);
    std::vector<nlohmann::json> messages, agents;
    std::string line;
    while (static_cast<int64_t>(messages.size()) < questions && std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json row = nlohmann::json::parse(line);
      nlohmann::json prompt = row.at("prompt");
      if (!system_text.empty())
        prompt.insert(prompt.begin(), nlohmann::json{{"role", "system"}, {"content", system_text}});
      messages.push_back(std::move(prompt));
      agents.push_back(row.value("agent_name", std::string()));
    }
    prompts.set_field("prompt", messages);
    prompts.set_field("agent_name", agents);
  }

  GenerationConfig g;
  g.max_new_tokens = bench::arg_int(argc, argv, "response-length", 112);
  g.n = bench::arg_int(argc, argv, "n", 8);
  g.kv_block_size = bench::arg_int(argc, argv, "block-size", 16);
  g.temperature = std::atof(bench::arg(argc, argv, "temperature", "1.0").c_str());
  g.seed = 1;
  const auto end = context.tokenizer->token_to_id("<|im_end|>");
  HF_CHECK(end.has_value(), "bench_agent_turns: the tokenizer has no <|im_end|>");
  g.eos_token_ids = generation_stop_ids(model_dir, *end);
  g.pad_token_id = context.tokenizer->token_to_id("<|endoftext|>").value_or(0);
  // A padded embedding's rows past the tokenizer's ids are never drawn (as the trainer's rollouts do).
  g.sampleable_vocab_size = std::min<int64_t>(context.tokenizer->vocab_size(), model->config().vocab_size);

  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  std::printf("model %s: %.2fM parameters, %lld questions x %lld episodes, response budget %lld\n", model_dir.c_str(),
              static_cast<double>(parameters) / 1e6, static_cast<long long>(questions),
              static_cast<long long>(g.n), static_cast<long long>(g.max_new_tokens));
  // Paths: 0 rounds, 1 continuous without sharing, 2 continuous with each prompt's episodes sharing its blocks,
  // 3 the same with prefix caching across prompts, 4 the third with each prefill alone.
  constexpr int kPaths = 5;
  const char* names[kPaths] = {"rounds, re-prefill  ", "continuous, delta   ", "continuous, shared  ",
                               "shared + prefixes   ", "prefills one by one "};
  std::vector<double> seconds[kPaths], generating[kPaths];
  double prefill[kPaths] = {}, turns[kPaths] = {}, calls[kPaths] = {}, peak[kPaths] = {}, cached[kPaths] = {},
         forwards[kPaths] = {};
  const std::string paths = bench::arg(argc, argv, "paths", "0,1,2,3,4");
  for (int64_t r = 0; r < repeats; ++r)
    for (int path = 0; path < kPaths; ++path) {
      if (paths.find(std::to_string(path)) == std::string::npos) continue;
      context.continuous_turns = path >= 1;
      context.share_prompt_blocks = path >= 2;
      GenerationConfig path_config = g;
      path_config.enable_prefix_caching = path >= 3;
      if (path == 4) path_config.max_num_batched_tokens = 1;
      const double start = bench::now_seconds();
      const DataProto batch = agent_generate_sequences(model, path_config, prompts, context);
      const double took = bench::now_seconds() - start;
      const nlohmann::json& m = batch.meta().at("agent");
      const auto episodes = static_cast<double>(batch.batch_size());
      seconds[path].push_back(took);
      generating[path].push_back(m.at("agent/generation_seconds").get<double>());
      prefill[path] += m.at("agent/prefill_tokens").get<double>();
      turns[path] += m.at("agent/turns_per_episode").get<double>() * episodes;
      calls[path] += m.at("agent/tool_calls").get<double>();
      if (path >= 1) peak[path] = std::max(peak[path], m.at("agent/peak_kv_blocks").get<double>());
      if (path >= 1) cached[path] += m.at("agent/prefix_cached_tokens").get<double>();
      if (path >= 1) forwards[path] += m.at("agent/prefill_forwards").get<double>();
      std::printf("%s repeat %lld: %.3f s (%.3f s generating), %.0f positions prefilled, %.0f turns, %.0f tool calls%s\n",
                  names[path], static_cast<long long>(r), took,
                  m.at("agent/generation_seconds").get<double>(),
                  m.at("agent/prefill_tokens").get<double>(), m.at("agent/turns_per_episode").get<double>() * episodes,
                  m.at("agent/tool_calls").get<double>(),
                  path >= 1 ? (", " + std::to_string(m.at("agent/reused_prefix_tokens").get<int64_t>()) +
                               " cached positions reused, peak " +
                               std::to_string(m.at("agent/peak_kv_blocks").get<int64_t>()) + " KV blocks, " +
                               std::to_string(m.at("agent/shared_prompt_blocks").get<int64_t>()) +
                               " prompt blocks shared, " +
                               std::to_string(m.at("agent/prefix_cached_tokens").get<int64_t>()) +
                               " prompt positions found in other prompts' blocks, " +
                               std::to_string(m.at("agent/prefill_forwards").get<int64_t>()) + " prefill forwards")
                                  .c_str()
                            : "");
    }
  // Medians: the tools are processes, and a loaded machine delays some of them by seconds.
  double median[kPaths], median_generating[kPaths];
  for (int path = 0; path < kPaths; ++path) {
    if (seconds[path].empty()) seconds[path] = generating[path] = {std::nan("")};
    std::sort(seconds[path].begin(), seconds[path].end());
    std::sort(generating[path].begin(), generating[path].end());
    median[path] = seconds[path][seconds[path].size() / 2];
    median_generating[path] = generating[path][generating[path].size() / 2];
  }
  std::printf("median rollout: rounds %.3f s (%.3f s generating), continuous %.3f s (%.3f s generating)\n", median[0],
              median_generating[0], median[1], median_generating[1]);
  std::printf("re-prefill / delta: median generating time %.2fx\n", median_generating[0] / median_generating[1]);
  std::printf("re-prefill / delta: prefilled positions %.2fx, median wall time %.2fx (turns %.0f vs %.0f, tool calls %.0f vs %.0f)\n",
              prefill[0] / prefill[1], median[0] / median[1], turns[0], turns[1], calls[0], calls[1]);
  std::printf("unshared / shared prompts: prefilled positions %.0f / %.0f = %.2fx, peak KV blocks (block size %lld) "
              "%.0f / %.0f = %.2fx, median wall time %.2fx (turns %.0f vs %.0f)\n",
              prefill[1], prefill[2], prefill[1] / prefill[2], static_cast<long long>(g.kv_block_size), peak[1], peak[2],
              peak[1] / peak[2], median[1] / median[2], turns[1], turns[2]);
  std::printf("shared / shared + prefix caching: prefilled positions %.0f / %.0f = %.2fx (%.0f found in other prompts' "
              "blocks), peak KV blocks %.0f / %.0f = %.2fx, median generating time %.3f / %.3f s = %.2fx, median wall "
              "time %.2fx (turns %.0f vs %.0f)\n",
              prefill[2], prefill[3], prefill[2] / prefill[3], cached[3], peak[2], peak[3], peak[2] / peak[3],
              median_generating[2], median_generating[3], median_generating[2] / median_generating[3],
              median[2] / median[3], turns[2], turns[3]);
  std::printf("prefills one by one / together: prefill forwards %.0f / %.0f = %.2fx, median generating time %.3f / %.3f s "
              "= %.2fx, median wall time %.2fx (turns %.0f vs %.0f)\n",
              forwards[4], forwards[3], forwards[4] / forwards[3], median_generating[4], median_generating[3],
              median_generating[4] / median_generating[3], median[4] / median[3], turns[4], turns[3]);
  return 0;
}
