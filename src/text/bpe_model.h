// Byte-pair encoding: a word starts as its characters (or, with byte_fallback, <0xNN> byte tokens for
// characters outside the vocabulary) and adjacent pairs are merged by rank, lowest first.
#pragma once

#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "text/model.h"
#include "text/pair_map.h"

namespace hybridflow::text {

struct BpeOptions {
  std::optional<std::string> unk_token;
  std::string continuing_subword_prefix;  // before every symbol but a word's first
  std::string end_of_word_suffix;         // after a word's last symbol
  bool fuse_unk = false;                  // consecutive unknown characters give one unk
  bool byte_fallback = false;             // unknown characters as <0xNN> byte tokens
  bool ignore_merges = false;             // a word in the vocabulary is one token, merges aside
};

class BpeModel : public Model {
 public:
  // merges[i] has rank i. Throws hybridflow::Error when a merge names a token the vocabulary lacks.
  BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options);
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const override;

 private:
  struct Merge {
    int32_t rank;
    int32_t id;  // the merged token
  };
  static uint64_t pair_key(int32_t a, int32_t b) { return PairMap<Merge>::key(a, b); }
  // The initial symbols of a word, then the merges applied to them.
  void initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const;
  void tokenize_piece(std::string_view word, std::vector<int32_t>& ids) const;
  void apply_merges(std::vector<int32_t>& symbols) const;

  BpeOptions options_;
  std::optional<int32_t> unk_id_;
  PairMap<Merge> merges_;
  std::vector<int32_t> byte_token_ids_;  // id of <0xNN> for each byte, -1 where missing
  std::vector<int32_t> char_ids_;        // id of each single-character token below U+10000, -1 where none
  // SentencePiece-style vocabularies (no pre-tokenizer: a whole text is one word) never have "▁"
  // after another character inside a token, so no merge crosses such a place: the word is cut
  // there and each part is merged (and cached) on its own, with the same result. Empty when the
  // vocabulary does not have that property, or options make a word's edges matter.
  std::string cut_before_;

  // Words seen before and their ids. Bounded; words longer than kMaxCachedWord bytes are not kept.
  static constexpr size_t kCacheCapacity = 1 << 18, kMaxCachedWord = 256;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

}  // namespace hybridflow::text
