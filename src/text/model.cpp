#include "text/model.h"

#include "hybridflow/core/error.h"
#include "text/unicode.h"

namespace hybridflow::text {

Model::Model(Vocab vocab) : vocab_(std::move(vocab)) {
  // One pass over the vocab's nodes: the largest ids come early in hash order, so it grows a few times only.
  for (const auto& [token, id] : vocab_) {
    const auto i = static_cast<size_t>(id);
    if (i >= id_to_token_.size()) id_to_token_.resize(i + 1, nullptr);
    id_to_token_[i] = &token;
  }
}

void WordLevelModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  auto it = vocab_.find(word);
  if (it != vocab_.end()) {
    ids.push_back(it->second);
    return;
  }
  HF_CHECK(unk_id_.has_value(), "WordLevel: '", word, "' is not in the vocabulary and the model has no unk_token");
  ids.push_back(*unk_id_);
}

void WordPieceModel::tokenize(std::string_view word, std::vector<int32_t>& ids) const {
  size_t chars = 0;
  for (char c : word) chars += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  if (chars > max_chars_) {
    ids.push_back(unk_id_);
    return;
  }
  const size_t mark = ids.size();
  std::string candidate;
  size_t start = 0;
  while (start < word.size()) {
    size_t end = word.size();
    int32_t found = -1;
    while (start < end) {
      candidate.assign(start > 0 ? prefix_ : std::string());
      candidate.append(word.substr(start, end - start));
      auto it = vocab_.find(candidate);
      if (it != vocab_.end()) {
        found = it->second;
        break;
      }
      do --end;  // back one whole character
      while (end > start && (static_cast<unsigned char>(word[end]) & 0xc0) == 0x80);
    }
    if (found < 0) {
      ids.resize(mark);
      ids.push_back(unk_id_);
      return;
    }
    ids.push_back(found);
    start = end;
  }
}

}  // namespace hybridflow::text
