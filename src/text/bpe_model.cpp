#include "text/bpe_model.h"

#include <cstdio>
#include <queue>

#include "hybridflow/core/error.h"
#include "text/unicode.h"

namespace hybridflow::text {

BpeModel::BpeModel(Vocab vocab, const std::vector<std::pair<std::string, std::string>>& merges, BpeOptions options)
    : Model(std::move(vocab)), options_(std::move(options)) {
  if (options_.unk_token) {
    unk_id_ = token_to_id(*options_.unk_token);
    HF_CHECK(unk_id_.has_value(), "unk_token '", *options_.unk_token, "' is not in the vocabulary");
  }
  merges_.reserve(merges.size());
  const size_t prefix_len = options_.continuing_subword_prefix.size();
  std::string merged;  // one buffer for every merge's result
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto a = token_to_id(left), b = token_to_id(right);
    HF_CHECK(a && b, "merge ", rank, " ('", left, "' '", right, "') names a token that is not in the vocabulary");
    // The right part loses its continuation prefix inside the merged token.
    const bool strip = prefix_len > 0 && right.compare(0, prefix_len, options_.continuing_subword_prefix) == 0;
    merged.assign(left);
    merged.append(right, strip ? prefix_len : 0);
    auto id = token_to_id(merged);
    HF_CHECK(id, "merge ", rank, " ('", left, "' '", right, "') gives '", merged, "', which is not in the vocabulary");
    // The first listing of a pair wins, as in the reference.
    merges_.insert(pair_key(*a, *b), Merge{static_cast<int32_t>(rank), *id});
  }
  if (options_.byte_fallback) {
    byte_token_ids_.assign(256, -1);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof name, "<0x%02X>", b);
      if (auto id = token_to_id(name)) byte_token_ids_[static_cast<size_t>(b)] = *id;
    }
  }
  // One pass over the vocabulary for both: where "▁" occurs, and the single-character tokens.
  const std::string meta = "\xe2\x96\x81";  // ▁
  bool has_meta = false, meta_inside = false;
  char_ids_.assign(0x10000, -1);
  for (const auto& [token, id] : vocab_) {
    for (size_t pos = token.find(meta); pos != std::string::npos; pos = token.find(meta, pos + meta.size())) {
      has_meta = true;
      if (pos > 0 && token.compare(pos - meta.size(), meta.size(), meta) != 0) meta_inside = true;
    }
    if (token.empty()) continue;
    size_t len;
    const char32_t c = decode_utf8(token, 0, &len);
    if (len == token.size() && c < 0x10000) char_ids_[c] = id;
  }
  const bool edges_matter = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty() ||
                            options_.ignore_merges;
  // "▁" itself must be a token, or unknown characters on both sides of a cut could fuse into one unk.
  if (has_meta && !meta_inside && !edges_matter && token_to_id(meta)) cut_before_ = meta;
}

void BpeModel::initial_symbols(std::string_view word, std::vector<int32_t>& symbols) const {
  const bool affixes = !options_.continuing_subword_prefix.empty() || !options_.end_of_word_suffix.empty();
  int32_t pending_unk = -1;  // an unk not yet emitted (fuse_unk extends it)
  std::string affixed;
  size_t i = 0;
  while (i < word.size()) {
    size_t len;
    const char32_t c = decode_utf8(word, i, &len);
    const std::string_view ch = word.substr(i, len);
    const bool first = i == 0;
    i += len;
    int32_t id = -1;
    if (!affixes) {
      if (c < 0x10000) {
        id = char_ids_[c];
      } else if (auto found = token_to_id(ch)) {
        id = *found;
      }
    } else {
      affixed.assign(first ? "" : options_.continuing_subword_prefix);
      affixed += ch;
      if (i == word.size()) affixed += options_.end_of_word_suffix;
      if (auto found = token_to_id(affixed)) id = *found;
    }
    if (id >= 0) {
      if (pending_unk >= 0) symbols.push_back(pending_unk), pending_unk = -1;
      symbols.push_back(id);
      continue;
    }
    if (options_.byte_fallback) {
      const std::string_view bytes = affixes ? std::string_view(affixed) : ch;
      bool all = true;
      for (char b : bytes) all = all && byte_token_ids_[static_cast<unsigned char>(b)] >= 0;
      if (all) {
        for (char b : bytes) symbols.push_back(byte_token_ids_[static_cast<unsigned char>(b)]);
        continue;
      }
    }
    // Without an unk token the character is dropped, as the reference does.
    if (unk_id_) {
      if (pending_unk >= 0 && !options_.fuse_unk) symbols.push_back(pending_unk);
      pending_unk = *unk_id_;
    }
  }
  if (pending_unk >= 0) symbols.push_back(pending_unk);
}

void BpeModel::apply_merges(std::vector<int32_t>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2) return;
  // A doubly linked list over the symbols; a merge folds the right symbol into the left one.
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  struct Candidate {
    int32_t rank, pos, id;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push_pair = [&](int32_t left) {
    if (left < 0 || next[static_cast<size_t>(left)] < 0) return;
    const Merge* m = merges_.find(pair_key(symbols[static_cast<size_t>(left)],
                                           symbols[static_cast<size_t>(next[static_cast<size_t>(left)])]));
    if (m != nullptr) queue.push({m->rank, left, m->id});
  };
  for (size_t i = 0; i + 1 < n; ++i) push_pair(static_cast<int32_t>(i));
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    const auto pos = static_cast<size_t>(top.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    // Stale when either symbol has changed since this candidate was queued.
    const Merge* m = merges_.find(pair_key(symbols[pos], symbols[right]));
    if (m == nullptr || m->id != top.id) continue;
    symbols[pos] = top.id;
    alive[right] = false;
    next[pos] = next[right];
    if (next[right] >= 0) prev[static_cast<size_t>(next[right])] = top.pos;
    push_pair(prev[pos]);
    push_pair(top.pos);
  }
  size_t out = 0;
  for (size_t i = 0; i < n; ++i)
    if (alive[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

void BpeModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  if (cut_before_.empty() || word.size() <= kMaxCachedWord / 4) {
    tokenize_piece(word, ids);
    return;
  }
  // Cut before each "▁" that follows another character (see cut_before_).
  const size_t m = cut_before_.size();
  size_t start = 0;
  for (size_t pos = word.find(cut_before_, 1); pos != std::string_view::npos; pos = word.find(cut_before_, pos + m)) {
    if (pos < m || word.compare(pos - m, m, cut_before_) == 0) continue;
    tokenize_piece(word.substr(start, pos - start), ids);
    start = pos;
  }
  tokenize_piece(word.substr(start), ids);
}

void BpeModel::tokenize_piece(std::string_view word, std::vector<int32_t>& ids) const {
  if (word.empty()) return;
  const bool cacheable = word.size() <= kMaxCachedWord;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(word);
    if (it != cache_.end()) {
      ids.insert(ids.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  if (options_.ignore_merges) {
    if (auto id = token_to_id(word)) {
      ids.push_back(*id);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(word.size());
  initial_symbols(word, symbols);
  apply_merges(symbols);
  ids.insert(ids.end(), symbols.begin(), symbols.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() < kCacheCapacity) cache_.emplace(std::string(word), std::move(symbols));
  }
}

}  // namespace hybridflow::text
