// `hybridflow info [MODEL]`: this build and machine (libtorch, devices, bf16 support, collective backends);
// with a model directory, also its architecture and parameter count, and whether its weight files are
// whole and match config.json (their headers only: nothing is loaded). Exits 1 naming each problem.
#include <cstdio>
#include <string>

#include "commands.h"
#include "hybridflow/core/platform.h"
#include "hybridflow/model/model_config.h"
#include "hybridflow/model/model_size.h"
#include "hybridflow/model/pretrained.h"

namespace hybridflow::cli {

void add_info_command(CLI::App& app, Action& action) {
  auto dir = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "info", "Print libtorch version, devices, bf16 support and collective backends; with a model directory, "
              "its config and parameter count");
  cmd->add_option("model", *dir, "model directory (config.json inside)");
  cmd->callback([dir, &action] {
    action = [dir] {
      if (dir->empty()) {
        std::fputs(format_runtime_info(runtime_info()).c_str(), stdout);
        return 0;
      }
      ModelConfig c = load_model_config(*dir + "/config.json");
      std::printf("model            %s\n", dir->c_str());
      std::printf("architecture     %s (%s)\n", c.architecture.c_str(), c.model_type.c_str());
      std::printf("parameters       %lld (%s in %s)\n", static_cast<long long>(c.num_parameters()),
                  human_bytes(static_cast<double>(c.num_parameters()) *
                              static_cast<double>(c10::elementSize(parse_dtype(c.torch_dtype, "torch_dtype"))))
                      .c_str(),
                  c.torch_dtype.c_str());
      std::printf("vocab_size       %lld\n", static_cast<long long>(c.vocab_size));
      std::printf("hidden_size      %lld\n", static_cast<long long>(c.hidden_size));
      std::printf("intermediate     %lld\n", static_cast<long long>(c.intermediate_size));
      std::printf("layers           %lld\n", static_cast<long long>(c.num_hidden_layers));
      std::printf("heads / kv heads %lld / %lld (head_dim %lld)\n", static_cast<long long>(c.num_attention_heads),
                  static_cast<long long>(c.num_key_value_heads), static_cast<long long>(c.head_dim()));
      std::printf("max positions    %lld, rope_theta %g\n", static_cast<long long>(c.max_position_embeddings),
                  c.rope_theta);
      if (c.rope_scaling.scaled())
        std::printf("rope scaling     %s, factor %g, original context %lld\n", c.rope_scaling.type.c_str(),
                    c.rope_scaling.factor, static_cast<long long>(c.rope_scaling.original_max_position_embeddings));
      if (c.sliding_window > 0)
        std::printf("sliding window   %lld\n", static_cast<long long>(c.sliding_window));
      if (c.qk_norm()) std::printf("q/k head norms   yes\n");
      std::printf("tied embeddings  %s, qkv bias %s\n", c.tie_word_embeddings ? "yes" : "no",
                  c.attention_bias ? "yes" : "no");
      std::printf("dtype            %s\n", c.torch_dtype.c_str());
      // The weights' headers against their files and config.json: a truncated or mismatched model is not fine.
      const std::vector<std::string> problems = check_model_directory(*dir);
      if (problems.empty()) {
        std::printf("weights          ok (headers, sizes and shapes match config.json)\n");
        return 0;
      }
      for (const std::string& problem : problems) std::fprintf(stderr, "problem: %s\n", problem.c_str());
      std::fprintf(stderr, "%s: %zu problem(s); this model will not load\n", dir->c_str(), problems.size());
      return 1;
    };
  });
}

}  // namespace hybridflow::cli
