// Each normalizer, pre-tokenizer, model option, added-token option, post-processor and decoder
// on its own, in small tokenizer.json files written here, against the Python `tokenizers` library:
// the same normalized text, pre-tokens, ids and decoded text.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "hybridflow/text/tokenizer.h"
#include "support/temp_dir.h"
#include "tokenizer_corpus.h"
#include "tokenizer_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::json;

const char* const kMeta = "\xe2\x96\x81";  // ▁

// Words the WordLevel model of most cases knows (the rest are [UNK]), so that ids depend on exactly
// where the text was split.
json word_vocab() {
  const std::vector<std::string> words = {
      "[UNK]", "<s>", "</s>", "[CLS]", "[SEP]", "Hello", "hello", "world", ",", "!", "?", ".", "'", "s", "the", "The",
      "▁Hello", "▁world", "▁", " ", "  ", "\n", "Hello,", "world!", "1", "2", "3", "12", "123", "4", "tokens",
      "▁hello", "ĠHello", "Ġworld", "Hello world", "##lo", "lo", "Hel", "<0x41>", "<0xE4>", "<0xBD>", "<0xA0>",
      "<0xFF>", "a▁b", "Ġ", "ĉ", "Ċ", "café", "cafe\xcc\x81", "Привет", "мир", "<special>", "<norm>", "ab"};
  json vocab = json::object();
  for (size_t i = 0; i < words.size(); ++i) vocab[words[i]] = static_cast<int>(i);
  return vocab;
}

json word_level() { return {{"type", "WordLevel"}, {"vocab", word_vocab()}, {"unk_token", "[UNK]"}}; }

json added(int id, const std::string& content, bool special, bool normalized = false, bool lstrip = false,
           bool rstrip = false, bool single_word = false) {
  return {{"id", id},         {"content", content}, {"single_word", single_word}, {"lstrip", lstrip},
          {"rstrip", rstrip}, {"normalized", normalized}, {"special", special}};
}

json tokenizer_json(json normalizer, json pre_tokenizer, json model, json post_processor = nullptr,
                    json decoder = nullptr, json added_tokens = json::array()) {
  return {{"version", "1.0"},          {"truncation", nullptr},       {"padding", nullptr},
          {"added_tokens", added_tokens}, {"normalizer", normalizer}, {"pre_tokenizer", pre_tokenizer},
          {"post_processor", post_processor}, {"decoder", decoder},  {"model", model}};
}

json split(json pattern, const std::string& behavior, bool invert) {
  return {{"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
}

struct Case {
  std::string name;
  json tokenizer;
  std::vector<std::vector<int32_t>> decode_ids;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  const json none = nullptr;
  // Normalizers.
  for (const char* form : {"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
    out.push_back({std::string("normalizer ") + form, tokenizer_json({{"type", form}}, none, word_level()), {}});
  out.push_back({"normalizer Strip", tokenizer_json({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}, none, word_level()), {}});
  out.push_back({"normalizer Strip left", tokenizer_json({{"type", "Strip"}, {"strip_left", true}, {"strip_right", false}}, none, word_level()), {}});
  out.push_back({"normalizer Replace string", tokenizer_json({{"type", "Replace"}, {"pattern", {{"String", "  "}}}, {"content", "_"}}, none, word_level()), {}});
  out.push_back({"normalizer Replace regex", tokenizer_json({{"type", "Replace"}, {"pattern", {{"Regex", "\\s+"}}}, {"content", " "}}, none, word_level()), {}});
  out.push_back({"normalizer Prepend+Replace (SentencePiece)",
                 tokenizer_json({{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", kMeta}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}}}}, none, word_level()), {}});
  out.push_back({"normalizer Sequence NFKC+Lowercase+Strip",
                 tokenizer_json({{"type", "Sequence"}, {"normalizers", {{{"type", "NFKC"}}, {{"type", "Lowercase"}}, {{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}}}}}, none, word_level()), {}});
  out.push_back({"normalizer NFD+StripAccents", tokenizer_json({{"type", "Sequence"}, {"normalizers", {{{"type", "NFD"}}, {{"type", "StripAccents"}}}}}, none, word_level()), {}});
  for (const json& bert : {json{{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr}, {"lowercase", true}},
                           json{{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr}, {"lowercase", false}},
                           json{{"type", "BertNormalizer"}, {"clean_text", false}, {"handle_chinese_chars", false}, {"strip_accents", false}, {"lowercase", true}}})
    out.push_back({"normalizer " + bert.dump(), tokenizer_json(bert, none, word_level()), {}});
  // Pre-tokenizers.
  for (bool prefix : {false, true})
    for (bool regex : {false, true})
      out.push_back({"pre ByteLevel prefix=" + std::to_string(prefix) + " regex=" + std::to_string(regex),
                     tokenizer_json(none, {{"type", "ByteLevel"}, {"add_prefix_space", prefix}, {"trim_offsets", true}, {"use_regex", regex}}, word_level()), {}});
  for (const char* behavior : {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
    for (bool invert : {false, true}) {
      const std::string suffix = std::string(behavior) + (invert ? " inverted" : "");
      out.push_back({"pre Split regex " + suffix, tokenizer_json(none, split({{"Regex", "\\s+|[,.!?]"}}, behavior, invert), word_level()), {}});
      out.push_back({"pre Split string " + suffix, tokenizer_json(none, split({{"String", " "}}, behavior, invert), word_level()), {}});
    }
  // Literal patterns with regex metacharacters in them.
  out.push_back({"pre Split string |> Isolated", tokenizer_json(none, split({{"String", "|>"}}, "Isolated", false), word_level()), {}});
  out.push_back({"pre Split string ' MergedWithNext", tokenizer_json(none, split({{"String", "'"}}, "MergedWithNext", false), word_level()), {}});
  out.push_back({"normalizer Replace string .", tokenizer_json({{"type", "Replace"}, {"pattern", {{"String", "."}}}, {"content", "[dot]"}}, none, word_level()), {}});
  for (const char* scheme : {"first", "always", "never"})
    for (bool split_words : {true, false})
      out.push_back({std::string("pre Metaspace ") + scheme + (split_words ? " split" : " whole"),
                     tokenizer_json(none, {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split_words}}, word_level(), none,
                                    {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", scheme}, {"split", split_words}},
                                    json::array({added(51, "<special>", true)})),
                     {{16, 17, 18, 5}, {5, 18, 43, 16}, {18, 18, 6}}});
  for (bool individual : {false, true})
    out.push_back({std::string("pre Digits individual=") + (individual ? "1" : "0"), tokenizer_json(none, {{"type", "Digits"}, {"individual_digits", individual}}, word_level()), {}});
  for (const char* type : {"Whitespace", "WhitespaceSplit", "BertPreTokenizer"})
    out.push_back({std::string("pre ") + type, tokenizer_json(none, {{"type", type}}, word_level()), {}});
  for (const char* behavior : {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"})
    out.push_back({std::string("pre Punctuation ") + behavior, tokenizer_json(none, {{"type", "Punctuation"}, {"behavior", behavior}}, word_level()), {}});
  out.push_back({"pre Sequence WhitespaceSplit+Digits+Punctuation",
                 tokenizer_json(none, {{"type", "Sequence"}, {"pretokenizers", {{{"type", "WhitespaceSplit"}}, {{"type", "Digits"}, {"individual_digits", true}}, {{"type", "Punctuation"}, {"behavior", "Isolated"}}}}}, word_level()), {}});
  // Added tokens: special or not, stripping, single words, matched in normalized text.
  const json added_tokens = json::array({added(51, "<special>", true), added(52, "<norm>", false, true),
                                         added(100, "<ls>", true, false, true), added(101, "<rs>", true, false, false, true),
                                         added(102, "<both>", false, false, true, true), added(103, "word", false, false, false, false, true),
                                         added(104, "<spec", true), added(105, "<special>x", false), added(106, "HELLO", false, true)});
  out.push_back({"added tokens with Lowercase", tokenizer_json({{"type", "Lowercase"}}, {{"type", "WhitespaceSplit"}}, word_level(), none, none, added_tokens),
                 {{51, 5, 52, 54, 55}, {56, 57, 58, 59, 6, 60}}});
  out.push_back({"added tokens without normalizer", tokenizer_json(none, {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}}, word_level(), none, none, added_tokens), {}});
  // Post-processors, with pairs.
  const json special_s = {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}, {"</s>", {{"id", "</s>"}, {"ids", {2}}, {"tokens", {"</s>"}}}}};
  out.push_back({"post TemplateProcessing",
                 tokenizer_json(none, {{"type", "WhitespaceSplit"}}, word_level(),
                                {{"type", "TemplateProcessing"},
                                 {"single", {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                                 {"pair", {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}}, {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
                                 {"special_tokens", special_s}},
                                none, json::array({added(1, "<s>", true), added(2, "</s>", true)})),
                 {{1, 5, 2}}});
  out.push_back({"post BertProcessing", tokenizer_json(none, {{"type", "BertPreTokenizer"}}, word_level(), {{"type", "BertProcessing"}, {"sep", {"[SEP]", 4}}, {"cls", {"[CLS]", 3}}},
                                                       {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}}, json::array({added(3, "[CLS]", true), added(4, "[SEP]", true)})),
                 {{3, 37, 35, 8, 7, 4}, {5, 35, 36, 11, 12, 9}}});
  out.push_back({"post RobertaProcessing in a Sequence", tokenizer_json(none, {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}, word_level(),
                                                          {{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}, {{"type", "RobertaProcessing"}, {"sep", {"</s>", 2}}, {"cls", {"<s>", 1}}, {"trim_offsets", true}, {"add_prefix_space", true}}}}},
                                                          {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}, json::array({added(1, "<s>", true), added(2, "</s>", true)})),
                 {{1, 32, 33, 2}, {44, 45, 46}}});
  // Decoders on their own. (The reference's Strip panics on a token it would strip to nothing, so the
  // strip character here is one no token consists of.)
  out.push_back({"decoders Replace regex+ByteFallback+Fuse+Strip",
                 tokenizer_json(none, {{"type", "WhitespaceSplit"}}, word_level(), none,
                                {{"type", "Sequence"}, {"decoders", {{{"type", "Strip"}, {"content", "a"}, {"start", 1}, {"stop", 1}}, {{"type", "Replace"}, {"pattern", {{"Regex", "▁+"}}}, {"content", " "}}, {{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}),
                 {{16, 17, 38, 39, 40, 41}, {39, 40, 16}, {42, 42, 5}, {18, 18, 18, 5, 19, 19}, {43, 18}}});
  // BPE options: continuation prefix, end-of-word suffix, unknown characters fused or not, byte fallback.
  json bpe_vocab = {{"[UNK]", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"##a", 4}, {"##b", 5}, {"##c", 6}, {"ab", 7}, {"abc", 8},
                    {"##bc", 9}, {"c</w>", 10}, {"##c</w>", 11}, {"b</w>", 12}, {"##b</w>", 13}, {"a</w>", 14}, {"##a</w>", 15},
                    {"ab</w>", 16}, {"##bc</w>", 17}, {"<0x41>", 18}, {"<0xC3>", 19}, {"<0xA9>", 20}, {"abc</w>", 21}};
  json merges = {"a ##b", "ab ##c", "##b ##c", "a ##b</w>", "##b ##c</w>", "ab ##c</w>"};
  for (bool fuse : {false, true})
    out.push_back({std::string("BPE prefix+suffix fuse_unk=") + (fuse ? "1" : "0"),
                   tokenizer_json(none, {{"type", "WhitespaceSplit"}}, {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"}, {"end_of_word_suffix", "</w>"}, {"fuse_unk", fuse}, {"byte_fallback", false}, {"vocab", bpe_vocab}, {"merges", merges}}),
                   {}});
  json plain_vocab = {{"[UNK]", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"ab", 4}, {"abc", 5}, {"bc", 6}, {"<0x41>", 7}, {"<0xC3>", 8}, {"<0xA9>", 9}, {"<0x20>", 10}, {"cab", 11}};
  for (bool fuse : {false, true})
    out.push_back({std::string("BPE byte_fallback fuse_unk=") + (fuse ? "1" : "0"),
                   tokenizer_json(none, none, {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "[UNK]"}, {"fuse_unk", fuse}, {"byte_fallback", true}, {"vocab", plain_vocab}, {"merges", json::array({json::array({"a", "b"}), json::array({"b", "c"}), json::array({"ab", "c"}), json::array({"c", "ab"})})}},
                                  none, {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}),
                   {{1, 7, 8, 9, 2}, {8, 8, 9}, {9, 1}}});
  out.push_back({"BPE ignore_merges", tokenizer_json(none, {{"type", "WhitespaceSplit"}}, {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", "[UNK]"}, {"ignore_merges", true}, {"vocab", plain_vocab}, {"merges", {"b c", "a b"}}}), {}});
  out.push_back({"BPE no unk drops unknown characters", tokenizer_json(none, {{"type", "WhitespaceSplit"}}, {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"vocab", plain_vocab}, {"merges", {"b c", "a b"}}}), {}});
  // BERT: WordPiece with its normalizer, pre-tokenizer, post-processor and decoder.
  const std::vector<std::string> pieces = {"[UNK]", "[CLS]", "[SEP]", "hello", "hel", "##lo", "##l", "##o", "world", "##s", "the",
                                           "quick", "brown", "fox", ",", "!", ".", "'", "un", "##aff", "##able", "a", "##b", "##c",
                                           "你", "好", "世", "1", "##2", "##3", "cafe", "caf", "##e", "x", "##x", "привет", "ab"};
  json wp_vocab = json::object();
  for (size_t i = 0; i < pieces.size(); ++i) wp_vocab[pieces[i]] = static_cast<int>(i);
  for (int max_chars : {100, 4})
    out.push_back({"WordPiece BERT max_chars=" + std::to_string(max_chars),
                   tokenizer_json({{"type", "BertNormalizer"}, {"clean_text", true}, {"handle_chinese_chars", true}, {"strip_accents", nullptr}, {"lowercase", true}},
                                  {{"type", "BertPreTokenizer"}},
                                  {{"type", "WordPiece"}, {"unk_token", "[UNK]"}, {"continuing_subword_prefix", "##"}, {"max_input_chars_per_word", max_chars}, {"vocab", wp_vocab}},
                                  {{"type", "BertProcessing"}, {"sep", {"[SEP]", 2}}, {"cls", {"[CLS]", 1}}},
                                  {{"type", "WordPiece"}, {"prefix", "##"}, {"cleanup", true}},
                                  json::array({added(0, "[UNK]", true), added(1, "[CLS]", true), added(2, "[SEP]", true)})),
                   {{1, 4, 5, 8, 9, 14, 15, 2}, {18, 19, 20, 16, 17, 10}}});
  return out;
}

std::vector<std::string> texts() {
  std::vector<std::string> t = {
      "abc", "ab abc cab", "abcx xyz abé", "aaa bbb ccc", "cab abca", "Hello world", "Hello, world!", "hello  world ",
      "  Hello", "Hello<special>world", "Hello <special> world", "<special>", "x<norm>y <NORM> z", "a <ls> b", "a<rs>   b",
      "a   <both>   b", "word words sword word.", "a word_b word", "<spec <specialx <special>x", "HELLO hello HeLLo",
      "12 34567 ١٢٣ x1y2", "▁Hello▁world", "a▁b ▁", "tokens... !?!", "Ġ Ċ", "unaffable hellos HELLO Café abc xxxxx 123",
      "Hello\x01\x7f\xe2\x80\x8bworld \xef\xbf\xbd", "你好世界 hello你好", "xxxxxxxxxxxx abcab",
      "word\xcc\x81 x", "word1 1word", "\xc3\xa9word word\xd9\xa3", "-word- 'word' word_",
      "a\xc2\xa0<ls>\xe2\x80\x83" "b", "x\xc2\x85<rs>\xe3\x80\x80y\xe2\x80\x8b<rs>\xe2\x80\x8b",
      "\t<both>\n<both><both> <ls><ls>  <rs><rs>", "<ls>", "   <rs>   ", "<special>Hello world", "<special> Hello", " <special>",
      "\xf0\x9d\x94\x98word word\xe2\x80\x8d \xe2\x85\xa0word word\xc2\xb2 word",
  };
  for (const std::string& s : testing::tokenizer_corpus())
    if (s.size() < 400) t.push_back(s);
  for (std::string& s : testing::random_tokenizer_texts(150, 7)) t.push_back(std::move(s));
  return t;
}

TEST(TokenizerComponents, MatchTheReferenceOneByOne) {
  testing::TempDir dir;
  const std::vector<Case> all = cases();
  const std::vector<std::string> inputs = texts();
  json request = {{"jobs", json::array()}};
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string path = dir.file("case" + std::to_string(i) + ".json");
    std::ofstream(path) << all[i].tokenizer.dump(2);
    request["jobs"].push_back({{"name", all[i].name}, {"tokenizer", path}, {"texts", inputs}, {"pairs", json::array({json::array({"Hello", "world"}), json::array({"a b", ""})})}, {"decode_ids", all[i].decode_ids}});
  }
  const json response = testing::run_tokenizers_oracle(request);
  ASSERT_TRUE(response.contains("jobs"));
  for (size_t c = 0; c < all.size(); ++c) {
    SCOPED_TRACE(all[c].name);
    const json& ref = response["jobs"][all[c].name];
    Tokenizer tok = Tokenizer::from_file(dir.file("case" + std::to_string(c) + ".json"));
    for (size_t i = 0; i < inputs.size(); ++i) {
      const std::string& text = inputs[i];
      const json& r = ref["texts"][i];
      if (!r["normalized"].is_null()) {
        EXPECT_EQ(tok.normalize(text), r["normalized"].get<std::string>()) << "normalize: " << text;
      }
      if (!r["pre_tokens"].is_null()) {
        EXPECT_EQ(tok.pre_tokenize(text), r["pre_tokens"].get<std::vector<std::string>>()) << "pre_tokenize: " << text;
      }
      const auto plain = tok.encode(text, false);
      EXPECT_EQ(tok.encode(text, true), r["ids"].get<std::vector<int32_t>>()) << "encode: " << text;
      EXPECT_EQ(plain, r["ids_plain"].get<std::vector<int32_t>>()) << "encode without specials: " << text;
      EXPECT_EQ(tok.decode(plain, false), r["decoded"].get<std::string>()) << "decode: " << text;
      EXPECT_EQ(tok.decode(tok.encode(text, true), true), r["decoded_skip"].get<std::string>()) << "decode: " << text;
    }
    EXPECT_EQ(tok.encode_pair("Hello", "world", true), ref["pairs"][0]["ids"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.encode_pair("Hello", "world", false), ref["pairs"][0]["ids_plain"].get<std::vector<int32_t>>());
    EXPECT_EQ(tok.encode_pair("a b", "", true), ref["pairs"][1]["ids"].get<std::vector<int32_t>>());
    for (size_t k = 0; k < all[c].decode_ids.size(); ++k) {
      EXPECT_EQ(tok.decode(all[c].decode_ids[k], true), ref["decoded_ids"][k]["skip"].get<std::string>()) << "ids " << k;
      EXPECT_EQ(tok.decode(all[c].decode_ids[k], false), ref["decoded_ids"][k]["keep"].get<std::string>()) << "ids " << k;
    }
  }
}

}  // namespace
}  // namespace hybridflow::text
