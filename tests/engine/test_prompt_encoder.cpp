// Prompts as the RL trainer (and SFT) encode them at load: verl's truncation modes token for token, the
// data.max_prompt_length policy (error / cut / filter) on a megabyte-long prompt, and chat messages
// through a real model's template, encoded as verl does (checked against transformers).
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/engine/prompt_encoder.h"
#include "hybridflow/text/chat_template.h"
#include "support/error_of.h"
#include "support/python.h"
#include "support/run_command.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"

namespace hybridflow {
namespace {

using Json = nlohmann::ordered_json;
using testing::error_of;
using Ids = std::vector<int64_t>;

PromptRow plain(const std::string& prompt, const std::string& where = "data.jsonl:1") {
  PromptRow row;
  row.prompt = prompt;
  row.answer = "ok";
  row.where = where;
  return row;
}

PromptRow chat(const Json& messages, const std::string& where = "data.parquet: row 0") {
  PromptRow row;
  row.messages = messages;
  row.where = where;
  return row;
}

PromptOptions options(int64_t max_length, Truncation mode, bool filter = false) {
  PromptOptions o;
  o.max_prompt_length = max_length;
  o.truncation = mode;
  o.filter_overlong_prompts = filter;
  return o;
}

std::string tokenizer_dir(const std::string& name) { return testing::tokenizer_data_dir() + "/" + name; }

#define SKIP_WITHOUT_TOKENIZERS()                                                           \
  if (!std::filesystem::exists(tokenizer_dir("qwen3") + "/tokenizer_config.json"))          \
  GTEST_SKIP() << "no published tokenizers at " << testing::tokenizer_data_searched()

TEST(Truncation, CutsAsVerlDoes) {
  const Ids ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_EQ(truncate_prompt(ids, 4, Truncation::kLeft), (Ids{7, 8, 9, 10}));    // keeps the end
  EXPECT_EQ(truncate_prompt(ids, 4, Truncation::kRight), (Ids{1, 2, 3, 4}));    // keeps the start
  EXPECT_EQ(truncate_prompt(ids, 4, Truncation::kMiddle), (Ids{1, 2, 9, 10}));  // max/2 from each end
  EXPECT_EQ(truncate_prompt(ids, 5, Truncation::kMiddle), (Ids{1, 2, 8, 9, 10}));  // the odd token at the end
  EXPECT_EQ(truncate_prompt(ids, 1, Truncation::kMiddle), (Ids{10}));
  EXPECT_EQ(truncate_prompt(ids, 10, Truncation::kLeft), ids);  // not longer: unchanged
  EXPECT_EQ(truncate_prompt(ids, 3, Truncation::kError), ids);
  EXPECT_EQ(parse_truncation("middle"), Truncation::kMiddle);
  EXPECT_NE(error_of([] { parse_truncation("center"); }).find("data.truncation: expected error | left | right | middle"),
            std::string::npos);
}

TEST(PromptEncoder, PlainStringsEncodeAsTheyAlwaysDid) {
  const Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  PromptEncoder encoder(tok, "", options(512, Truncation::kError));
  PromptRow row = plain("12+34=");
  row.data_source = "addition";
  row.extra_info = {{"index", 4}};
  const auto prompts = encoder.encode({row}, "data.jsonl");
  ASSERT_EQ(prompts.size(), 1u);
  EXPECT_EQ(prompts[0].ids, tok.encode("12+34=", /*add_bos=*/true));
  EXPECT_EQ(prompts[0].text, "12+34=");
  EXPECT_EQ(prompts[0].answer, "ok");
  EXPECT_EQ(prompts[0].data_source, "addition");
  EXPECT_EQ(prompts[0].extra_info, (Json{{"index", 4}}));
  PromptOptions no_bos = options(512, Truncation::kError);
  no_bos.add_bos = false;
  EXPECT_EQ(PromptEncoder(tok, "", no_bos).encode({row}, "f")[0].ids, tok.encode("12+34=", false));
}

TEST(PromptEncoder, OverlongPromptsFailOrAreCutOrDroppedAsConfigured) {
  const Tokenizer tok = Tokenizer::from_alphabet("abcdefghij");
  const Ids full = tok.encode("abcdefgh", true);  // bos + 8 letters = 9 tokens
  ASSERT_EQ(full.size(), 9u);
  const std::vector<PromptRow> rows = {plain("ab", "d.jsonl:1"), plain("abcdefgh", "d.jsonl:2")};

  const std::string msg = error_of([&] { PromptEncoder(tok, "", options(5, Truncation::kError)).encode(rows, "d.jsonl"); });
  EXPECT_NE(msg.find("d.jsonl:2: the prompt is 9 tokens, longer than data.max_prompt_length = 5"), std::string::npos) << msg;
  EXPECT_NE(msg.find("data.truncation"), std::string::npos) << msg;

  EXPECT_EQ(PromptEncoder(tok, "", options(5, Truncation::kLeft)).encode(rows, "d")[1].ids, Ids(full.end() - 5, full.end()));
  EXPECT_EQ(PromptEncoder(tok, "", options(5, Truncation::kRight)).encode(rows, "d")[1].ids, Ids(full.begin(), full.begin() + 5));
  const auto middle = PromptEncoder(tok, "", options(5, Truncation::kMiddle)).encode(rows, "d");
  EXPECT_EQ(middle[1].ids, (Ids{full[0], full[1], full[6], full[7], full[8]}));
  EXPECT_EQ(middle[1].text, "abcdefgh");  // the text the scorers see stays whole
  EXPECT_EQ(middle[0].ids, tok.encode("ab", true));  // short prompts untouched

  // Filtering goes first, as in verl: the overlong row is dropped whatever the truncation mode.
  const auto kept = PromptEncoder(tok, "", options(5, Truncation::kLeft, /*filter=*/true)).encode(rows, "d");
  ASSERT_EQ(kept.size(), 1u);
  EXPECT_EQ(kept[0].ids, tok.encode("ab", true));
  const std::string all = error_of(
      [&] { PromptEncoder(tok, "", options(2, Truncation::kError, true)).encode(rows, "d.jsonl"); });
  EXPECT_NE(all.find("d.jsonl: all 2 prompts are longer than data.max_prompt_length = 2"), std::string::npos) << all;
}

// A 1 MB line used to become a [1, ~1M] prompt and an attention mask of about a terabyte; now it is an
// error, a prompt of max_prompt_length tokens, or gone, and any of these in well under a few seconds.
TEST(PromptEncoder, AMegabytePromptIsRejectedCutOrDroppedQuickly) {
  const Tokenizer tok = Tokenizer::from_alphabet("0123456789+=");
  const std::vector<PromptRow> rows = {plain("1+1=", "big.jsonl:1"), plain(std::string(1 << 20, '7') + "+1=", "big.jsonl:2")};
  const auto start = std::chrono::steady_clock::now();
  const std::string msg =
      error_of([&] { PromptEncoder(tok, "", options(512, Truncation::kError)).encode(rows, "big.jsonl"); });
  EXPECT_NE(msg.find("big.jsonl:2: the prompt is 1048580 tokens, longer than data.max_prompt_length = 512"),
            std::string::npos)
      << msg;
  const auto cut = PromptEncoder(tok, "", options(512, Truncation::kLeft)).encode(rows, "big.jsonl");
  ASSERT_EQ(cut[1].ids.size(), 512u);
  EXPECT_EQ(cut[1].ids, tok.encode(std::string(509, '7') + "+1=", false));  // the end, question mark included
  const auto filtered = PromptEncoder(tok, "", options(512, Truncation::kError, true)).encode(rows, "big.jsonl");
  ASSERT_EQ(filtered.size(), 1u);
  EXPECT_EQ(filtered[0].text, "1+1=");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 10.0);
  std::printf("three passes over a 1 MB prompt: %.2f s\n", seconds);
}

// transformers' ids for verl's encoding, one list per tokenizer directory (one Python start for all):
// apply_chat_template(tokenize=False, add_generation_prompt=True), then tokenizer(text, add_special_tokens=False).
std::vector<Ids> transformers_ids(const std::vector<std::string>& dirs, const Json& messages) {
  testing::TempDir tmp;
  const std::string script = tmp.file("ids.py"), input = tmp.file("messages.json");
  write_file_atomic(input, messages.dump());
  write_file_atomic(script, "import json, sys\nfrom transformers import AutoTokenizer\n"
                            "messages = json.load(open(sys.argv[1]))\nout = []\n"
                            "for d in sys.argv[2:]:\n"
                            "    tok = AutoTokenizer.from_pretrained(d)\n"
                            "    text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)\n"
                            "    out.append(tok(text, add_special_tokens=False)['input_ids'])\n"
                            "print(json.dumps(out))\n");
  std::string command = testing::python_for_tests() + " " + script + " " + input;
  for (const auto& dir : dirs) command += " " + dir;
  const auto run = testing::capture_command(command + " 2>/dev/null");
  EXPECT_EQ(run.exit_code, 0) << "needs the project venv's transformers (scripts/setup.sh): " << run.output;
  return run.exit_code == 0 ? Json::parse(run.output).get<std::vector<Ids>>() : std::vector<Ids>(dirs.size());
}

TEST(PromptEncoder, ChatMessagesGoThroughTheTemplateAndMatchTransformers) {
  const Json messages = Json::parse(R"([{"role": "system", "content": "Answer with a number."},
                                        {"role": "user", "content": "What is 12+34?"}])");
  SKIP_WITHOUT_TOKENIZERS();
  const std::vector<std::string> names = {"llama3", "qwen3"};
  const auto expected = transformers_ids({tokenizer_dir(names[0]), tokenizer_dir(names[1])}, messages);
  for (size_t t = 0; t < names.size(); ++t) {
    const std::string& name = names[t];
    SCOPED_TRACE(name);
    const std::string dir = tokenizer_dir(name);
    const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");
    PromptEncoder encoder(tok, dir, options(512, Truncation::kError));
    const auto prompts = encoder.encode({chat(messages)}, "data.parquet");
    ASSERT_EQ(prompts.size(), 1u);
    const auto config = text::TokenizerConfig::load(dir + "/tokenizer_config.json");
    EXPECT_EQ(prompts[0].text, text::apply_chat_template(config, messages, /*add_generation_prompt=*/true));
    EXPECT_EQ(prompts[0].ids, expected[t]);
    if (name == "llama3") {  // the template writes <|begin_of_text|>; it must not be added a second time
      EXPECT_EQ(prompts[0].ids[0], tok.bos_id());
      EXPECT_NE(prompts[0].ids[1], tok.bos_id());
    }
    // data.apply_chat_template: a plain string goes in as one user message.
    PromptOptions wrap = options(512, Truncation::kError);
    wrap.apply_chat_template = true;
    const Json user = Json::parse(R"([{"role": "user", "content": "What is 12+34?"}])");
    EXPECT_EQ(PromptEncoder(tok, dir, wrap).encode({plain("What is 12+34?")}, "d")[0].ids,
              PromptEncoder(tok, dir, options(512, Truncation::kError)).encode({chat(user)}, "d")[0].ids);
    // Lengths count the template's tokens too.
    const auto n = static_cast<int64_t>(prompts[0].ids.size());
    const auto cut = PromptEncoder(tok, dir, options(n - 3, Truncation::kLeft)).encode({chat(messages)}, "d");
    EXPECT_EQ(cut[0].ids, Ids(prompts[0].ids.begin() + 3, prompts[0].ids.end()));
  }
}

// verl's data.apply_chat_template_kwargs and actor_rollout_ref.model.custom_chat_template: Qwen3 without thinking
// and a replaced template give transformers' ids for apply_chat_template(..., enable_thinking=False) and for
// tokenizer.chat_template = the custom one.
TEST(PromptEncoder, TemplateKwargsAndACustomTemplateMatchTransformers) {
  SKIP_WITHOUT_TOKENIZERS();
  const std::string dir = tokenizer_dir("qwen3");
  const std::string custom = "{% for m in messages %}<<{{ m.role }}>> {{ m.content }}\n{% endfor %}"
                             "{% if add_generation_prompt %}<<assistant>>{% endif %}";
  const Json messages = Json::parse(R"([{"role": "user", "content": "What is 12+34?"}])");
  testing::TempDir tmp;
  write_file_atomic(tmp.file("messages.json"), messages.dump());
  write_file_atomic(tmp.file("template.jinja"), custom);
  write_file_atomic(tmp.file("ids.py"),
                    "import json, sys\nfrom transformers import AutoTokenizer\n"
                    "messages = json.load(open(sys.argv[1]))\ntok = AutoTokenizer.from_pretrained(sys.argv[3])\n"
                    "def ids(text): return tok(text, add_special_tokens=False)['input_ids']\n"
                    "no_think = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, "
                    "enable_thinking=False)\n"
                    "tok.chat_template = open(sys.argv[2]).read()\n"
                    "custom = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)\n"
                    "print(json.dumps([no_think, ids(no_think), custom, ids(custom)]))\n");
  const auto run = testing::capture_command(testing::python_for_tests() + " " + tmp.file("ids.py") + " " +
                                            tmp.file("messages.json") + " " + tmp.file("template.jinja") + " " + dir +
                                            " 2>/dev/null");
  ASSERT_EQ(run.exit_code, 0) << "needs the project venv's transformers (scripts/setup.sh): " << run.output;
  const Json expected = Json::parse(run.output);
  const Tokenizer tok = Tokenizer::load(dir + "/tokenizer.json");

  PromptOptions no_think = options(512, Truncation::kError);
  no_think.chat_template_kwargs = {{"enable_thinking", false}};
  const EncodedPrompt a = PromptEncoder(tok, dir, no_think).encode({chat(messages)}, "d")[0];
  EXPECT_EQ(a.text, expected[0].get<std::string>());
  EXPECT_NE(a.text.find("<think>\n\n</think>"), std::string::npos) << a.text;  // what the variable changes
  EXPECT_EQ(a.ids, expected[1].get<Ids>());
  const EncodedPrompt thinking = PromptEncoder(tok, dir, options(512, Truncation::kError)).encode({chat(messages)}, "d")[0];
  EXPECT_EQ(thinking.text.find("<think>"), std::string::npos) << thinking.text;

  PromptOptions replaced = options(512, Truncation::kError);
  replaced.custom_chat_template = custom;
  replaced.apply_chat_template = true;  // a plain string through the custom template
  const EncodedPrompt b = PromptEncoder(tok, dir, replaced).encode({plain("What is 12+34?")}, "d")[0];
  EXPECT_EQ(b.text, expected[2].get<std::string>());
  EXPECT_EQ(b.text, "<<user>> What is 12+34?\n<<assistant>>");
  EXPECT_EQ(b.ids, expected[3].get<Ids>());
  // A custom template that fails on a row names the key, not the model directory.
  replaced.custom_chat_template = "{{ raise_exception('no system prompts') }}";
  const std::string failed =
      error_of([&] { PromptEncoder(tok, dir, replaced).encode({plain("hi", "t.jsonl:4")}, "t.jsonl"); });
  EXPECT_NE(failed.find("t.jsonl:4: actor_rollout_ref.model.custom_chat_template failed on this prompt"),
            std::string::npos)
      << failed;
}

TEST(PromptEncoder, ChatPromptsWithoutATemplateNameTheRowAndTheModel) {
  SKIP_WITHOUT_TOKENIZERS();
  const Json messages = Json::parse(R"([{"role": "user", "content": "hi"}])");
  const std::string gpt2 = tokenizer_dir("gpt2");  // tokenizer_config.json without a chat template
  const Tokenizer tok = Tokenizer::load(gpt2 + "/tokenizer.json");
  std::string msg = error_of([&] {
    PromptEncoder(tok, gpt2, options(512, Truncation::kError)).encode({chat(messages, "train.parquet: row 3")}, "train.parquet");
  });
  EXPECT_NE(msg.find("train.parquet: row 3: the prompt has chat messages"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model directory " + gpt2 + " has none"), std::string::npos) << msg;
  msg = error_of([&] {
    PromptEncoder(Tokenizer::from_alphabet("hi"), "", options(512, Truncation::kError))
        .encode({chat(messages, "train.parquet: row 0")}, "train.parquet");
  });
  EXPECT_NE(msg.find("train.parquet: row 0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("model.path is empty"), std::string::npos) << msg;
  testing::TempDir empty;
  PromptOptions wrap = options(512, Truncation::kError);
  wrap.apply_chat_template = true;
  msg = error_of([&] { PromptEncoder(tok, empty.path(), wrap).encode({plain("hi", "t.jsonl:1")}, "t.jsonl"); });
  EXPECT_NE(msg.find("t.jsonl:1: the prompt is a plain string and data.apply_chat_template is true"), std::string::npos)
      << msg;
  EXPECT_NE(msg.find(empty.path() + " has no tokenizer_config.json"), std::string::npos) << msg;
}

}  // namespace
}  // namespace hybridflow
