#include "hybridflow/model/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"
#include "support/temp_dir.h"

namespace hybridflow {
namespace {

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

}  // namespace
}  // namespace hybridflow
