// `hybridflow tokenize --tokenizer DIR (TEXT | --file F | --messages F.json [--tools T.json]) [--no-special] [--json]`:
// the ids and tokens of a text under a tokenizer directory (tokenizer.json, and tokenizer_config.json
// for its special ids and chat template), exactly as Hugging Face `tokenizers` encodes it. --messages
// renders a JSON list of {role, content} with the chat template and the generation prompt first, then
// encodes it without adding special tokens (the template writes them), as transformers'
// apply_chat_template(tokenize=True) does; --tools passes a JSON list of OpenAI function schemas to the
// template as transformers' tools= does. Plain output is one line per token (id, token, the text it
// decodes to); --json prints one object {"text", "ids", "tokens"}.
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/model/tokenizer.h"
#include "hybridflow/text/chat_template.h"

namespace hybridflow::cli {
namespace {

struct TokenizeOptions {
  std::string tokenizer_dir;
  std::string text;
  std::string file;
  std::string messages;
  std::string tools;
  bool no_special = false;
  bool json = false;
};

// A JSON file holding a non-empty list of objects; `what` describes one item for the error.
nlohmann::ordered_json read_json_object_list(const std::string& path, const char* what) {
  nlohmann::ordered_json list;
  try {
    list = nlohmann::ordered_json::parse(read_file(path));
  } catch (const nlohmann::json::exception& e) {
    HF_FAIL(path, ": not JSON (", e.what(), "); expected a list of ", what);
  }
  HF_CHECK(list.is_array() && !list.empty(), path, ": expected a non-empty JSON list of ", what);
  for (size_t i = 0; i < list.size(); ++i)
    HF_CHECK(list[i].is_object(), path, ": item ", i, " is ", list[i].type_name(), "; expected ", what);
  return list;
}

// The conversation in a --messages file rendered with the tokenizer directory's chat template.
std::string rendered_messages(const TokenizeOptions& o) {
  const nlohmann::ordered_json messages = read_json_object_list(o.messages, "{\"role\": ..., \"content\": ...} messages");
  const nlohmann::ordered_json tools =
      o.tools.empty() ? nlohmann::ordered_json(nullptr)
                      : read_json_object_list(o.tools, "OpenAI function schemas {\"type\": \"function\", \"function\": {...}}");
  const auto config = text::TokenizerConfig::load(o.tokenizer_dir + "/tokenizer_config.json");
  return text::apply_chat_template(config, messages, /*add_generation_prompt=*/true, tools);
}

// The text to encode, from exactly one source.
std::string input_text(const TokenizeOptions& o) {
  const int sources = (o.text.empty() ? 0 : 1) + (o.file.empty() ? 0 : 1) + (o.messages.empty() ? 0 : 1);
  HF_CHECK(sources == 1,
           "tokenize: give the text to encode as an argument, with --file F or with --messages F.json (exactly one)");
  HF_CHECK(o.tools.empty() || !o.messages.empty(), "tokenize: --tools ", o.tools, " needs --messages (tools are rendered by the chat template)");
  if (!o.messages.empty()) return rendered_messages(o);
  return o.file.empty() ? o.text : read_file(o.file);
}

// A token shown on one line: control characters and quotes escaped as JSON does.
std::string shown(const std::string& s) { return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); }

int run_tokenize(const TokenizeOptions& o) {
  const std::string text = input_text(o);
  const Tokenizer tok = Tokenizer::load(o.tokenizer_dir + "/tokenizer.json");
  const bool add_special = !o.no_special && o.messages.empty();  // a chat template writes its own
  const std::vector<int64_t> ids = tok.encode(text, add_special);
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
  cmd->add_option("--messages", opts->messages,
                  "a JSON list of {role, content}: rendered with the chat template (and the generation prompt), "
                  "then encoded without adding special tokens");
  cmd->add_option("--tools", opts->tools,
                  "with --messages: a JSON list of OpenAI function schemas, rendered by the chat template (its tools=)");
  cmd->add_flag("--no-special", opts->no_special, "do not add the post-processor's special tokens (e.g. BOS)");
  cmd->add_flag("--json", opts->json, "print one JSON object {\"text\", \"ids\", \"tokens\"}");
  cmd->callback([opts, &action] { action = [opts] { return run_tokenize(*opts); }; });
}

}  // namespace hybridflow::cli
