// `hybridflow tokenize --tokenizer DIR (TEXT | --file F) [--no-special] [--json]`: the ids and tokens
// of a text under a tokenizer directory (tokenizer.json, and tokenizer_config.json for its special
// ids), exactly as Hugging Face `tokenizers` encodes it. Plain output is one line per token (id,
// token, the text it decodes to); --json prints one object {"text", "ids", "tokens"}.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/tokenizer.h"

namespace hybridflow::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  bool no_special = false;
  bool json = false;
};

// The text to encode, from exactly one source. Another source (such as chat messages rendered with
// the tokenizer's chat template) is one more option and one more branch here.
std::string input_text(const TokenizeOptions& o) {
  const int sources = (o.text.empty() ? 0 : 1) + (o.file.empty() ? 0 : 1);
  HF_CHECK(sources == 1, "tokenize: give the text to encode as an argument or with --file F (exactly one)");
  return o.file.empty() ? o.text : read_file(o.file);
}

// A token shown on one line: control characters and quotes escaped as JSON does.
std::string shown(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

int run_tokenize(const TokenizeOptions& o) {
  const std::string text = input_text(o);
  const Tokenizer tok = Tokenizer::load(o.tokenizer_dir + "/tokenizer.json");
  const std::vector<int64_t> ids = tok.encode(text, /*add_bos=*/!o.no_special);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) tokens.push_back(tok.token(id));
  if (o.json) {
    nlohmann::json out = {{"text", text}, {"ids", ids}, {"tokens", tokens}};
    std::printf("%s\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
    return 0;
  }
  std::printf("%zu tokens\n", ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::printf("%8lld  %-24s %s\n", static_cast<long long>(ids[i]), shown(tokens[i]).c_str(),
                shown(tok.decode({ids[i]}, /*skip_special=*/false)).c_str());
  }
  return 0;
}

}  // namespace

void add_tokenize_command(CLI::App& app, Action& action) {
  auto opts = std::make_shared<TokenizeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "tokenize", "Encode a text with a tokenizer directory (tokenizer.json) and print its ids and tokens");
  cmd->add_option("--tokenizer", opts->tokenizer_dir, "directory with tokenizer.json (and tokenizer_config.json)")
      ->required();
  cmd->add_option("text", opts->text, "the text to encode");
  cmd->add_option("--file", opts->file, "encode this file's contents instead");
  cmd->add_flag("--no-special", opts->no_special, "do not add the post-processor's special tokens (e.g. BOS)");
  cmd->add_flag("--json", opts->json, "print one JSON object {\"text\", \"ids\", \"tokens\"}");
  cmd->callback([opts, &action] { action = [opts] { return run_tokenize(*opts); }; });
}

}  // namespace hybridflow::cli
