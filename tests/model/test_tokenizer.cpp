#include "hybridflow/model/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "hybridflow/text/tokenizer.h"
#include "support/temp_dir.h"
#include "support/testdata_dir.h"

namespace hybridflow {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(Tokenizer, SpecialsComeFirstThenCharactersInOrder) {
  Tokenizer t = Tokenizer::from_alphabet("ba a\n");
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.bos_id(), 1);
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.unk_id(), 3);
  EXPECT_EQ(t.vocab_size(), 4 + 4);  // duplicate 'a' counted once
  EXPECT_EQ(t.token(4), "b");
  EXPECT_EQ(t.token(5), "a");
  EXPECT_EQ(t.token(6), " ");
  EXPECT_EQ(t.token(7), "\n");
}

TEST(Tokenizer, EncodeDecodeRoundTripIncludingUtf8) {
  Tokenizer t = Tokenizer::from_alphabet("0123456789+=\n é✓");
  const std::string text = "12+3=15\né ✓";
  std::vector<int64_t> ids = t.encode(text);
  EXPECT_EQ(ids.size(), 11u);  // one id per character, multi-byte ones included
  EXPECT_EQ(t.decode(ids), text);
  std::vector<int64_t> with_bos = t.encode(text, /*add_bos=*/true);
  ASSERT_EQ(with_bos.size(), ids.size() + 1);
  EXPECT_EQ(with_bos[0], t.bos_id());
  EXPECT_EQ(t.decode(with_bos), text);
}

TEST(Tokenizer, DecodeSkipsSpecialsOnlyWhenAsked) {
  Tokenizer t = Tokenizer::from_alphabet("ab");
  std::vector<int64_t> ids = {t.bos_id(), 4, 5, t.eos_id(), t.pad_id()};
  EXPECT_EQ(t.decode(ids), "ab");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/false), "<s>ab</s><pad>");
  EXPECT_THAT(error_of([&] { t.decode({99}); }), HasSubstr("token id 99 out of range [0, 6)"));
  EXPECT_THAT(error_of([&] { t.decode({-1}); }), HasSubstr("token id -1 out of range"));
}

TEST(Tokenizer, UnknownCharacterIsAnErrorNamingIt) {
  Tokenizer t = Tokenizer::from_alphabet("ab");
  EXPECT_THAT(error_of([&] { t.encode("abz"); }), HasSubstr("character 'z' at byte offset 2 is not in the vocabulary"));
  EXPECT_THAT(error_of([&] { t.encode("a\tb"); }), HasSubstr("'\\x09'"));
  // Special token text in the input is plain characters, never the special id.
  Tokenizer angle = Tokenizer::from_alphabet("<s>");
  EXPECT_EQ(angle.encode("<s>"), (std::vector<int64_t>{4, 5, 6}));
  EXPECT_THAT(error_of([&] { t.encode(std::string("a\xff", 2)); }), HasSubstr("invalid UTF-8 at byte offset 1"));
}

TEST(Tokenizer, SaveLoadGivesEqualTokenizer) {
  testing::TempDir dir;
  Tokenizer t = Tokenizer::from_alphabet("xyz \né");
  t.save(dir.file("tokenizer.json"));
  Tokenizer back = Tokenizer::load(dir.file("tokenizer.json"));
  EXPECT_TRUE(back == t);
  EXPECT_EQ(back.vocab_size(), t.vocab_size());
  EXPECT_EQ(back.encode("x é\ny"), t.encode("x é\ny"));
}

TEST(Tokenizer, JsonHasHuggingFaceStructure) {
  testing::TempDir dir;
  Tokenizer t = Tokenizer::from_alphabet("ab");
  t.save(dir.file("tokenizer.json"));
  json doc = json::parse(read_file(dir.file("tokenizer.json")));
  EXPECT_EQ(doc["version"], "1.0");
  ASSERT_EQ(doc["added_tokens"].size(), 4u);
  const std::vector<std::string> specials = {"<pad>", "<s>", "</s>", "<unk>"};
  for (size_t i = 0; i < specials.size(); ++i) {
    const json& a = doc["added_tokens"][i];
    EXPECT_EQ(a["id"], static_cast<int64_t>(i));
    EXPECT_EQ(a["content"], specials[i]);
    EXPECT_EQ(a["special"], true);
    for (const char* flag : {"single_word", "lstrip", "rstrip", "normalized"}) EXPECT_EQ(a[flag], false) << flag;
  }
  EXPECT_TRUE(doc["normalizer"].is_null());
  EXPECT_EQ(doc["pre_tokenizer"]["type"], "Split");
  EXPECT_EQ(doc["pre_tokenizer"]["behavior"], "Isolated");
  EXPECT_TRUE(doc["pre_tokenizer"]["pattern"].contains("Regex"));
  EXPECT_EQ(doc["model"]["type"], "WordLevel");
  EXPECT_EQ(doc["model"]["unk_token"], "<unk>");
  EXPECT_EQ(doc["model"]["vocab"]["a"], 4);
  EXPECT_EQ(doc["model"]["vocab"]["b"], 5);
  EXPECT_EQ(doc["model"]["vocab"]["<pad>"], 0);
  EXPECT_EQ(doc["decoder"]["type"], "Fuse");
}

TEST(Tokenizer, LoadRejectsBrokenFilesNamingFileAndField) {
  testing::TempDir dir;
  const std::string path = dir.file("tokenizer.json");
  Tokenizer::from_alphabet("ab").save(path);
  const json good = json::parse(read_file(path));
  auto load_with = [&](const std::function<void(json&)>& edit) {
    json doc = good;
    edit(doc);
    write_file_atomic(path, doc.dump());
    return error_of([&] { Tokenizer::load(path); });
  };
  EXPECT_THAT(load_with([](json& d) { d.erase("model"); }), HasSubstr("missing field 'model'"));
  EXPECT_THAT(load_with([](json& d) { d["version"] = "2.0"; }), HasSubstr("field 'version'"));
  EXPECT_THAT(load_with([](json& d) { d["model"]["type"] = "BPE"; }), HasSubstr("field 'model.type'"));
  EXPECT_THAT(load_with([](json& d) { d["model"].erase("vocab"); }), HasSubstr("missing field 'model.vocab'"));
  EXPECT_THAT(load_with([](json& d) { d["model"]["vocab"]["a"] = 5; }), HasSubstr("gives id 5 to both"));
  EXPECT_THAT(load_with([](json& d) { d["model"]["vocab"]["a"] = 40; }), HasSubstr("ids must be dense"));
  EXPECT_THAT(load_with([](json& d) { d["model"]["vocab"]["a"] = "x"; }), HasSubstr("must be an integer id"));
  EXPECT_THAT(load_with([](json& d) { d["model"]["vocab"].erase("<unk>"), d["model"]["vocab"]["<oov>"] = 3; }),
              HasSubstr("must give id 3 to '<unk>'"));
  EXPECT_THAT(load_with([](json& d) { d["added_tokens"].erase(3); }), HasSubstr("field 'added_tokens'"));
  EXPECT_THAT(load_with([](json& d) { d["pre_tokenizer"] = nullptr; }), HasSubstr("pre_tokenizer.type"));
  write_file_atomic(path, "{oops");
  std::string bad_json = error_of([&] { Tokenizer::load(path); });
  EXPECT_THAT(bad_json, HasSubstr(path));
  EXPECT_THAT(bad_json, HasSubstr("not valid JSON"));
  EXPECT_THAT(error_of([&] { Tokenizer::load(dir.file("missing.json")); }), HasSubstr("missing.json"));
}

// Published tokenizers load through the text layer (whose ids tests/text checks against the Python
// library); special ids come from tokenizer_config.json.
class PublishedTokenizer : public ::testing::Test {
 protected:
  std::string dir(const std::string& name) {
    return hybridflow::testing::tokenizer_data_dir() + "/" + name;
  }
  bool have(const std::string& name) { return file_exists(dir(name) + "/tokenizer.json"); }
};

TEST_F(PublishedTokenizer, Llama3SpecialIdsFromTheConfigAndIdsFromTheTextLayer) {
  if (!have("llama3")) GTEST_SKIP() << "not found: " << dir("llama3") << " (set HF_TESTDATA_DIR)";
  Tokenizer t = Tokenizer::load(dir("llama3") + "/tokenizer.json");
  text::Tokenizer reference = text::Tokenizer::from_file(dir("llama3") + "/tokenizer.json");
  EXPECT_EQ(t.vocab_size(), reference.vocab_size());
  EXPECT_EQ(t.bos_id(), *reference.token_to_id("<|begin_of_text|>"));
  EXPECT_EQ(t.eos_id(), *reference.token_to_id("<|end_of_text|>"));
  EXPECT_EQ(t.pad_id(), -1);  // the config names none
  const std::string text = "Hello, world! Привет 👋\n<|eot_id|>";
  // add_bos applies the file's post-processor; this published file's is ByteLevel, which adds no
  // <|begin_of_text|> (neither tokenizers nor transformers add one for it).
  const std::vector<int64_t> with_bos = t.encode(text, /*add_bos=*/true), without = t.encode(text);
  const std::vector<int32_t> ref_plain = reference.encode(text, false), ref_special = reference.encode(text, true);
  EXPECT_EQ(without, std::vector<int64_t>(ref_plain.begin(), ref_plain.end()));
  EXPECT_EQ(with_bos, std::vector<int64_t>(ref_special.begin(), ref_special.end()));
  EXPECT_EQ(t.decode(without, /*skip_special=*/false), text);
  EXPECT_EQ(t.decode(without), "Hello, world! Привет 👋\n");  // <|eot_id|> is special
  EXPECT_EQ(t.token(t.bos_id()), "<|begin_of_text|>");
  EXPECT_THAT(error_of([&] { t.decode({t.vocab_size()}); }), HasSubstr("out of range"));
  // save() writes back the published files, which load the same.
  testing::TempDir tmp;
  t.save(tmp.file("tokenizer.json"));
  Tokenizer back = Tokenizer::load(tmp.file("tokenizer.json"));
  EXPECT_TRUE(back == t);
  EXPECT_EQ(back.bos_id(), t.bos_id());
  EXPECT_EQ(back.encode(text, true), with_bos);
}

TEST_F(PublishedTokenizer, QwenAndSentencePieceSpecialIds) {
  if (!have("qwen3") || !have("spm-bpe-32k")) GTEST_SKIP() << "not found under " << hybridflow::testing::tokenizer_data_dir();
  Tokenizer qwen = Tokenizer::load(dir("qwen3") + "/tokenizer.json");
  EXPECT_EQ(qwen.bos_id(), -1);  // "bos_token": null
  EXPECT_EQ(qwen.token(qwen.eos_id()), "<|im_end|>");
  EXPECT_EQ(qwen.token(qwen.pad_id()), "<|endoftext|>");
  EXPECT_EQ(qwen.encode("hi", true), qwen.encode("hi", false));  // Qwen adds no special tokens
  Tokenizer spm = Tokenizer::load(dir("spm-bpe-32k") + "/tokenizer.json");
  EXPECT_EQ(spm.token(spm.bos_id()), "<s>");
  EXPECT_EQ(spm.token(spm.unk_id()), "<unk>");
  // Its TemplateProcessing post-processor adds <s> with add_bos, and only then.
  const std::vector<int64_t> with_bos = spm.encode("Hello", true), without = spm.encode("Hello", false);
  ASSERT_EQ(with_bos.size(), without.size() + 1);
  EXPECT_EQ(with_bos.front(), spm.bos_id());
  EXPECT_EQ(std::vector<int64_t>(with_bos.begin() + 1, with_bos.end()), without);
  EXPECT_EQ(spm.decode(spm.encode("Hello  world", true)), "Hello  world");
}

TEST_F(PublishedTokenizer, BadConfigIsAnErrorNamingIt) {
  if (!have("gpt2")) GTEST_SKIP() << "not found: " << dir("gpt2");
  testing::TempDir tmp;
  write_file_atomic(tmp.file("tokenizer.json"), read_file(dir("gpt2") + "/tokenizer.json"));
  write_file_atomic(tmp.file("tokenizer_config.json"), R"({"bos_token": {"content": "<nope>"}})");
  EXPECT_THAT(error_of([&] { Tokenizer::load(tmp.file("tokenizer.json")); }),
              AllOf(HasSubstr("tokenizer_config.json"), HasSubstr("bos_token"), HasSubstr("<nope>")));
  write_file_atomic(tmp.file("tokenizer_config.json"), R"({"eos_token": "<|endoftext|>"})");
  Tokenizer t = Tokenizer::load(tmp.file("tokenizer.json"));
  EXPECT_EQ(t.token(t.eos_id()), "<|endoftext|>");
  EXPECT_EQ(t.bos_id(), -1);
}

}  // namespace
}  // namespace hybridflow
