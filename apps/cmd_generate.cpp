// `hybridflow generate`: sample from a model directory. Prompts come from --prompt (repeatable) or a
// JSONL file with a "prompt" field; with --task, rows that carry an "answer" are scored too.
#include <torch/torch.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/jsonl.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/engine/generation.h"
#include "hybridflow/model/pretrained.h"
#include "hybridflow/tasks/task.h"

namespace hybridflow::cli {

void add_generate_command(CLI::App& app, Action& action) {
  struct Options {
    std::string model;
    std::vector<std::string> prompts;
    std::string prompts_file;
    std::string task;
    int64_t limit = 0;
    GenerationConfig gen;
  };
  auto opts = std::make_shared<Options>();
  opts->gen.max_new_tokens = 32;
  CLI::App* cmd = app.add_subcommand("generate", "Sample responses from a model directory");
  cmd->add_option("model", opts->model, "model directory")->required();
  cmd->add_option("-p,--prompt", opts->prompts, "a prompt (repeatable)");
  cmd->add_option("--prompts-file", opts->prompts_file, "JSONL file with a \"prompt\" field per line");
  cmd->add_option("--task", opts->task, "score rows that carry an \"answer\" with this built-in task");
  cmd->add_option("--limit", opts->limit, "use at most this many prompts from the file (0 = all)");
  cmd->add_option("--max-new-tokens", opts->gen.max_new_tokens)->capture_default_str();
  cmd->add_option("--temperature", opts->gen.temperature)->capture_default_str();
  cmd->add_option("--top-k", opts->gen.top_k, "0 = off")->capture_default_str();
  cmd->add_option("--top-p", opts->gen.top_p)->capture_default_str();
  cmd->add_flag("--greedy", opts->gen.greedy, "argmax decoding");
  cmd->add_option("-n,--num-samples", opts->gen.n, "samples per prompt")->capture_default_str();
  cmd->add_option("--seed", opts->gen.seed)->capture_default_str();
  cmd->callback([opts, &action] {
    action = [opts] {
      init_threads();
      warn_if_slow_blas();
      std::vector<std::string> prompts = opts->prompts;
      std::vector<std::string> answers;
      if (!opts->prompts_file.empty()) {
        for (const auto& row : read_jsonl(opts->prompts_file)) {
          if (opts->limit > 0 && static_cast<int64_t>(prompts.size()) >= opts->limit) break;
          prompts.push_back(row.at("prompt").get<std::string>());
          answers.push_back(row.contains("answer") ? row["answer"].get<std::string>() : "");
        }
      }
      HF_CHECK(!prompts.empty(), "generate: no prompts; pass --prompt TEXT or --prompts-file FILE.jsonl");
      Pretrained pre = load_pretrained(opts->model);
      GenerationConfig gen = opts->gen;
      gen.eos_token_ids = generation_stop_ids(opts->model, pre.tokenizer.eos_id());
      gen.pad_token_id = std::max<int64_t>(0, pre.tokenizer.pad_id());
      gen.sampleable_vocab_size = std::min(pre.tokenizer.vocab_size(), pre.config.vocab_size);
      std::vector<std::vector<int64_t>> ids;
      for (const auto& p : prompts) ids.push_back(pre.tokenizer.encode(p, /*add_bos=*/true));
      GenerationOutput out = generate(pre.model, ids, gen);
      auto task = opts->task.empty() ? nullptr : make_task(opts->task);
      double score_sum = 0;
      int64_t scored = 0;
      for (int64_t row = 0; row < out.responses.size(0); ++row) {
        int64_t prompt_index = row / gen.n;
        auto tokens = out.responses[row].masked_select(out.response_mask[row].to(torch::kBool));
        std::vector<int64_t> resp(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
        std::string text = pre.tokenizer.decode(resp);
        std::printf("%s%s", prompts[prompt_index].c_str(), text.c_str());
        if (task && prompt_index < static_cast<int64_t>(answers.size()) && !answers[prompt_index].empty()) {
          double s = task->score(text, Example{prompts[prompt_index], answers[prompt_index]});
          score_sum += s;
          ++scored;
          std::printf("    [answer %s, score %.2f]", answers[prompt_index].c_str(), s);
        }
        std::printf("\n");
      }
      if (scored > 0) std::printf("mean score %.4f over %lld responses\n", score_sum / scored, static_cast<long long>(scored));
      return 0;
    };
  });
}

}  // namespace hybridflow::cli
