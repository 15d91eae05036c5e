// Loading tokenizer.json: what is not supported or malformed is an error that names the file, the
// JSON path and the value, never a tokenizer that encodes differently from the reference.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "hybridflow/core/error.h"
#include "hybridflow/text/tokenizer.h"
#include "support/error_of.h"
#include "support/temp_dir.h"
#include "text/tokenizer_json_reader.h"

namespace hybridflow::text {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using json = nlohmann::json;

json valid_doc() {
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", {{{"id", 0}, {"content", "<s>"}, {"single_word", false}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}, {"special", true}}}},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}}},
          {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}}}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Fuse"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "<unk>"}, {"vocab", {{"<s>", 0}, {"<unk>", 1}, {"a", 2}, {"b", 3}, {"ab", 4}}}, {"merges", {"a b"}}}}};
}

class TokenizerJson : public ::testing::Test {
 protected:
  std::string path() const { return dir_.file("tokenizer.json"); }
  // The error loading valid_doc() after `edit`.
  std::string load_error(const std::function<void(json&)>& edit) {
    json doc = valid_doc();
    edit(doc);
    std::ofstream(path()) << doc.dump();
    return testing::error_of([&] { Tokenizer::from_file(path()); });
  }
  testing::TempDir dir_;
};

TEST_F(TokenizerJson, ValidFileLoadsAndEncodes) {
  std::ofstream(path()) << valid_doc().dump();
  Tokenizer tok = Tokenizer::from_file(path());
  EXPECT_EQ(tok.encode("AB ab<s>x"), (std::vector<int32_t>{4, 4, 0, 1}));
  EXPECT_EQ(tok.decode({4, 0, 2}, false), "ab<s>a");
  EXPECT_EQ(tok.decode({4, 0, 2}, true), "aba");
  EXPECT_EQ(tok.vocab_size(), 5);
}

TEST_F(TokenizerJson, UnknownComponentTypeNamesPathAndValue) {
  EXPECT_THAT(load_error([](json& d) { d["pre_tokenizer"]["pretokenizers"][1]["type"] = "Fancy"; }),
              AllOf(HasSubstr(path()), HasSubstr("pre_tokenizer.pretokenizers[1].type"), HasSubstr("\"Fancy\""),
                    HasSubstr("unsupported pre-tokenizer")));
  EXPECT_THAT(load_error([](json& d) { d["normalizer"]["normalizers"][0]["type"] = "Precompiled"; }),
              AllOf(HasSubstr("normalizer.normalizers[0].type"), HasSubstr("\"Precompiled\"")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["type"] = "Unigram"; }),
              AllOf(HasSubstr("model.type"), HasSubstr("\"Unigram\""), HasSubstr("supported: BPE, WordLevel, WordPiece")));
  EXPECT_THAT(load_error([](json& d) { d["decoder"] = {{"type", "CTC"}}; }),
              AllOf(HasSubstr("decoder.type"), HasSubstr("\"CTC\"")));
  EXPECT_THAT(load_error([](json& d) { d["post_processor"] = {{"type", "Magic"}}; }),
              AllOf(HasSubstr("post_processor.type"), HasSubstr("\"Magic\"")));
  EXPECT_THAT(load_error([](json& d) { d["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "a"}}}, {"behavior", "Sideways"}, {"invert", false}}; }),
              AllOf(HasSubstr("pre_tokenizer.behavior"), HasSubstr("\"Sideways\"")));
}

TEST_F(TokenizerJson, UnsupportedOptionsAreErrors) {
  EXPECT_THAT(load_error([](json& d) { d["model"]["dropout"] = 0.1; }),
              AllOf(HasSubstr("model.dropout"), HasSubstr("0.1")));
  EXPECT_THAT(load_error([](json& d) { d["truncation"] = {{"max_length", 8}}; }),
              AllOf(HasSubstr("truncation"), HasSubstr("not supported")));
  EXPECT_THAT(load_error([](json& d) { d["padding"] = {{"pad_id", 0}}; }), HasSubstr("padding"));
  EXPECT_THAT(load_error([](json& d) { d["version"] = "2.0"; }), AllOf(HasSubstr("version"), HasSubstr("\"2.0\"")));
  // An option this implementation does not read could change the ids: an error, not ignored.
  EXPECT_THAT(load_error([](json& d) { d["model"]["magic_merges"] = true; }),
              AllOf(HasSubstr("model.magic_merges"), HasSubstr("unsupported option")));
  EXPECT_THAT(load_error([](json& d) { d["pre_tokenizer"]["pretokenizers"][1]["split_everything"] = 1; }),
              HasSubstr("pre_tokenizer.pretokenizers[1].split_everything: unsupported option"));
  EXPECT_THAT(load_error([](json& d) { d["added_tokens"][0]["strip_everything"] = true; }),
              HasSubstr("added_tokens[0].strip_everything"));
  EXPECT_THAT(load_error([](json& d) { d["extra"] = 1; }), HasSubstr("extra: unsupported option"));
}

TEST_F(TokenizerJson, MalformedFilesNameTheFileAndField) {
  std::ofstream(path()) << "{\"version\": \"1.0\", oops";
  EXPECT_THAT(testing::error_of([&] { Tokenizer::from_file(path()); }), AllOf(HasSubstr(path()), HasSubstr("not valid JSON")));
  EXPECT_THAT(testing::error_of([&] { Tokenizer::from_file(dir_.file("missing.json")); }), HasSubstr("missing.json"));
  EXPECT_THAT(load_error([](json& d) { d["model"].erase("vocab"); }), AllOf(HasSubstr(path()), HasSubstr("model.vocab: missing field")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["vocab"]["a"] = "two"; }), AllOf(HasSubstr("model.vocab"), HasSubstr("'a'")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["vocab"]["a"] = 2000000000; }), AllOf(HasSubstr("model.vocab"), HasSubstr("far beyond")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["merges"] = {"a b c"}; }), HasSubstr("model.merges[0]"));
  EXPECT_THAT(load_error([](json& d) { d["model"]["merges"] = {"a zz"}; }), AllOf(HasSubstr("model"), HasSubstr("'zz'")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["unk_token"] = "<nope>"; }), HasSubstr("<nope>"));
  EXPECT_THAT(load_error([](json& d) { d["added_tokens"][0]["lstrip"] = "yes"; }), HasSubstr("added_tokens[0].lstrip"));
  EXPECT_THAT(load_error([](json& d) { d["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}, {"invert", false}}; }),
              AllOf(HasSubstr("pre_tokenizer.pattern.Regex"), HasSubstr("(unclosed")));
  EXPECT_THAT(load_error([](json& d) { d["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Glob", "*"}}}, {"behavior", "Isolated"}}; }),
              HasSubstr("pre_tokenizer.pattern"));
}

TEST_F(TokenizerJson, BadInputAndIdsAreErrors) {
  std::ofstream(path()) << valid_doc().dump();
  Tokenizer tok = Tokenizer::from_file(path());
  EXPECT_THAT(testing::error_of([&] { tok.encode(std::string("ab\xff", 3)); }), HasSubstr("invalid UTF-8 at byte offset 2"));
  // The reference drops ids it has no token for; here that is an error, like the rest of hybridflow.
  EXPECT_THAT(testing::error_of([&] { tok.decode({2, 99}); }), HasSubstr("token id 99 out of range [0, 5)"));
  EXPECT_THAT(testing::error_of([&] { tok.decode({-1}); }), HasSubstr("token id -1"));
}

// The large parts (model.vocab, model.merges) are read without a JSON tree; the rest is the tree
// json::parse gives, with the large parts as placeholders.
TEST(TokenizerJsonReader, ReadsTheLargePartsApartAndKeepsTheRest) {
  json doc = valid_doc();
  doc["model"]["merges"] = {"a b", {"<s>", "a"}};
  auto parts = read_tokenizer_json_parts(doc.dump());
  ASSERT_TRUE(parts.has_value());
  ASSERT_TRUE(parts->vocab && parts->merges);
  EXPECT_EQ(*parts->vocab, (Vocab{{"<s>", 0}, {"<unk>", 1}, {"a", 2}, {"b", 3}, {"ab", 4}}));
  EXPECT_EQ(*parts->merges, (Merges{{"a", "b"}, {"<s>", "a"}}));
  json rest = doc;
  rest["model"]["vocab"] = json::object();
  rest["model"]["merges"] = json::array();
  EXPECT_EQ(parts->rest, rest);
  // A vocab or merges elsewhere is part of the tree.
  auto other = read_tokenizer_json_parts(R"({"x": {"vocab": {"a": 1}}, "model": [{"merges": ["a b"]}]})");
  ASSERT_TRUE(other.has_value());
  EXPECT_FALSE(other->vocab || other->merges);
  EXPECT_EQ(other->rest, json::parse(R"({"x": {"vocab": {"a": 1}}, "model": [{"merges": ["a b"]}]})"));
}

// Anything but the regular form is left to the tree's readers, which name the entry at fault.
TEST(TokenizerJsonReader, GivesUpOnIrregularLargeParts) {
  auto with_model = [](const std::string& model) {
    return R"({"version": "1.0", "model": )" + model + "}";
  };
  for (const char* model : {
           R"({"vocab": {"a": 0, "a": 1}})",         // a repeated token
           R"({"vocab": {"a": 0, "b": 0}})",         // a repeated id
           R"({"vocab": {"a": -1}})",                 // negative
           R"({"vocab": {"a": 1.0}})",                // not an integer
           R"({"vocab": {"a": "1"}})",
           R"({"vocab": {"a": 2147483648}})",         // beyond int32
           R"({"vocab": {"a": 0, "b": 2000000}})",    // far beyond the vocabulary's size
           R"({"vocab": {"a": {}}})",
           R"({"merges": ["a b c"]})",
           R"({"merges": ["ab"]})",
           R"({"merges": [["a"]]})",
           R"({"merges": [["a", "b", "c"]]})",
           R"({"merges": [["a", 1]]})",
           R"({"merges": [1]})",
           R"({"vocab": {}, "vocab": {}})",           // a repeated large part
       }) {
    EXPECT_FALSE(read_tokenizer_json_parts(with_model(model)).has_value()) << model;
  }
  EXPECT_FALSE(read_tokenizer_json_parts(R"({"model": {}, "model": {"vocab": {}}})").has_value());
}

TEST(TokenizerJsonReader, TextThatIsNotJsonGivesJsonParseError) {
  for (const std::string& text : {std::string("{\"version\": \"1.0\", oops"), std::string("{\"model\": {\"vocab\": {\"a\": 1,}}}"),
                                  std::string("{} trailing"), std::string("")}) {
    std::string expected;
    try {
      const json parsed = json::parse(text);
    } catch (const json::exception& e) {
      expected = e.what();
    }
    ASSERT_FALSE(expected.empty()) << text;
    try {
      (void)read_tokenizer_json_parts(text);
      ADD_FAILURE() << "no error for " << text;
    } catch (const json::parse_error& e) {
      EXPECT_EQ(std::string(e.what()), expected);
    }
  }
}

// Irregular files load as before: a repeated key keeps its last value, merges may be pairs.
TEST_F(TokenizerJson, IrregularLargePartsLoadAsTheTreeReadsThem) {
  std::string text = valid_doc().dump();
  const std::string vocab = R"("vocab":{"<s>":0,"<unk>":1,"a":2,"ab":4,"b":3})";
  ASSERT_NE(text.find(vocab), std::string::npos);
  text.replace(text.find(vocab), vocab.size(), R"("vocab":{"<s>":0,"<unk>":1,"a":9,"ab":4,"b":3,"a":2})");
  std::ofstream(path()) << text;
  Tokenizer tok = Tokenizer::from_file(path());
  EXPECT_EQ(tok.token_to_id("a"), 2);
  EXPECT_EQ(tok.encode("ab b"), (std::vector<int32_t>{4, 3}));

  json pairs = valid_doc();
  pairs["model"]["merges"] = json::array({json::array({"a", "b"})});
  std::ofstream(path()) << pairs.dump();
  EXPECT_EQ(Tokenizer::from_file(path()).encode("ab b"), (std::vector<int32_t>{4, 3}));
  EXPECT_THAT(load_error([](json& d) { d["model"]["vocab"]["a"] = -1; }), AllOf(HasSubstr("model.vocab"), HasSubstr("entry 'a' must be a non-negative integer id, got -1")));
  EXPECT_THAT(load_error([](json& d) { d["model"]["merges"] = json::array({json::array({"a"})}); }), HasSubstr("model.merges[0]: must be \"a b\" or [\"a\", \"b\"], got [\"a\"]"));
}

}  // namespace
}  // namespace hybridflow::text
