// hybridflow's text::Tokenizer against the Python `tokenizers` library on published tokenizer.json
// files (GPT-2, Llama-3, Qwen3, a SentencePiece-style BPE with byte fallback): the same ids with and
// without special tokens, the same decoded text, on a corpus of many scripts, emoji, whitespace,
// code and special-token text, including inputs of over 10,000 characters, and 600 random
// concatenations of awkward fragments.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "hybridflow/text/tokenizer.h"
#include "tokenizer_corpus.h"
#include "tokenizer_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::json;
const char* const kNames[] = {"gpt2", "llama3", "qwen3", "spm-bpe-32k"};

std::string tokenizer_path(const std::string& name) {
  return testing::tokenizer_data_dir() + "/" + name + "/tokenizer.json";
}

// Ids to decode: random ones (partial UTF-8 bytes, specials) and the encodings of the corpus.
std::vector<std::vector<int32_t>> random_id_lists(int32_t vocab_size) {
  std::mt19937 rng(1234);
  std::vector<std::vector<int32_t>> lists;
  for (int n = 0; n < 40; ++n) {
    std::vector<int32_t> ids;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int k = 0; k < len; ++k) {
      // Favour the low ids (bytes and byte tokens) and the top ids (added tokens).
      const uint32_t r = rng() % 4;
      const uint32_t range = static_cast<uint32_t>(vocab_size);
      ids.push_back(static_cast<int32_t>(r == 0 ? rng() % 300 : r == 1 ? range - 1 - rng() % 300 : rng() % range));
    }
    lists.push_back(ids);
  }
  return lists;
}

class TokenizerOracle : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    corpus_ = new std::vector<std::string>(testing::tokenizer_corpus());
    for (std::string& s : testing::random_tokenizer_texts(600, 20261124)) corpus_->push_back(std::move(s));
    json request = {{"jobs", json::array()}};
    for (const char* name : kNames) {
      if (!std::filesystem::exists(tokenizer_path(name))) continue;
      std::vector<std::string> pairs_first = {"Hello", "", "two words"}, pairs_second = {"world", "b", "你好"};
      json pairs = json::array();
      for (size_t i = 0; i < pairs_first.size(); ++i) pairs.push_back({pairs_first[i], pairs_second[i]});
      request["jobs"].push_back({{"name", name},
                                 {"tokenizer", tokenizer_path(name)},
                                 {"texts", *corpus_},
                                 {"pairs", pairs},
                                 {"decode_ids", json::array()}});
    }
    if (request["jobs"].empty()) return;
    // The random ids need the vocabulary size, which our own load gives.
    for (json& job : request["jobs"]) {
      Tokenizer tok = Tokenizer::from_file(job["tokenizer"]);
      for (auto& ids : random_id_lists(tok.vocab_size())) job["decode_ids"].push_back(ids);
    }
    response_ = new json(testing::run_tokenizers_oracle(request));
  }
  static void TearDownTestSuite() {
    delete corpus_;
    delete response_;
  }

  // The tokenizer and the reference's answers, or a skip naming the missing file.
  const json* reference(const std::string& name) {
    if (!std::filesystem::exists(tokenizer_path(name))) return nullptr;
    if (response_ == nullptr || !response_->contains("jobs") || !(*response_)["jobs"].contains(name)) return nullptr;
    return &(*response_)["jobs"][name];
  }

  void compare(const std::string& name) {
    if (!std::filesystem::exists(tokenizer_path(name)))
      GTEST_SKIP() << "published tokenizer " << name << " not found (looked in " << testing::tokenizer_data_searched()
                   << "; set HF_TESTDATA_DIR)";
    const json* ref = reference(name);
    ASSERT_NE(ref, nullptr) << "no reference answers (see the oracle failure above)";
    Tokenizer tok = Tokenizer::from_file(tokenizer_path(name));
    EXPECT_EQ(tok.vocab_size(), (*ref)["vocab_size"].get<int32_t>());
    size_t exact = 0, round_trips = 0;
    for (size_t i = 0; i < corpus_->size(); ++i) {
      const std::string& text = (*corpus_)[i];
      const json& r = (*ref)["texts"][i];
      const std::string shown = text.size() > 80 ? text.substr(0, 80) + "... (" + std::to_string(text.size()) + " bytes)" : text;
      const auto ids = tok.encode(text, true);
      const auto plain = tok.encode(text, false);
      EXPECT_EQ(ids, r["ids"].get<std::vector<int32_t>>()) << name << " with special tokens: " << shown;
      EXPECT_EQ(plain, r["ids_plain"].get<std::vector<int32_t>>()) << name << " without special tokens: " << shown;
      if (plain == r["ids_plain"].get<std::vector<int32_t>>()) {
        ++exact;
        EXPECT_EQ(tok.tokens(plain), r["tokens"].get<std::vector<std::string>>()) << name << ": " << shown;
      }
      const std::string decoded = tok.decode(plain, false);
      EXPECT_EQ(decoded, r["decoded"].get<std::string>()) << name << " decode: " << shown;
      EXPECT_EQ(tok.decode(ids, true), r["decoded_skip"].get<std::string>()) << name << " decode skipping: " << shown;
      // Where the reference round-trips, so must we.
      if (r["decoded"].get<std::string>() == text) {
        ++round_trips;
        EXPECT_EQ(decoded, text) << name << " round trip: " << shown;
      }
      if (!r["normalized"].is_null()) {
        EXPECT_EQ(tok.normalize(text), r["normalized"].get<std::string>()) << shown;
      }
    }
    const json& pairs = (*ref)["pairs"];
    const std::vector<std::pair<std::string, std::string>> pair_texts = {{"Hello", "world"}, {"", "b"}, {"two words", "你好"}};
    for (size_t i = 0; i < pair_texts.size(); ++i) {
      EXPECT_EQ(tok.encode_pair(pair_texts[i].first, pair_texts[i].second, true),
                pairs[i]["ids"].get<std::vector<int32_t>>()) << name << " pair " << i;
      EXPECT_EQ(tok.encode_pair(pair_texts[i].first, pair_texts[i].second, false),
                pairs[i]["ids_plain"].get<std::vector<int32_t>>()) << name << " pair " << i;
    }
    const auto lists = random_id_lists(tok.vocab_size());
    for (size_t i = 0; i < lists.size(); ++i) {
      EXPECT_EQ(tok.decode(lists[i], true), (*ref)["decoded_ids"][i]["skip"].get<std::string>()) << name << " ids " << i;
      EXPECT_EQ(tok.decode(lists[i], false), (*ref)["decoded_ids"][i]["keep"].get<std::string>()) << name << " ids " << i;
    }
    std::printf("[ %s ] %zu/%zu texts encode exactly as tokenizers %s; %zu round-trip in the reference\n", name.c_str(),
                exact, corpus_->size(), (*response_)["versions"]["tokenizers"].get<std::string>().c_str(), round_trips);
  }

  static std::vector<std::string>* corpus_;
  static json* response_;
};

std::vector<std::string>* TokenizerOracle::corpus_ = nullptr;
json* TokenizerOracle::response_ = nullptr;

TEST_F(TokenizerOracle, Gpt2) { compare("gpt2"); }
TEST_F(TokenizerOracle, Llama3) { compare("llama3"); }
TEST_F(TokenizerOracle, Qwen3) { compare("qwen3"); }
TEST_F(TokenizerOracle, SentencePieceBpeWithByteFallback) { compare("spm-bpe-32k"); }

}  // namespace
}  // namespace hybridflow::text
