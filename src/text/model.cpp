#include "text/model.h"

#include "hybridflow/core/error.h"

namespace hybridflow::text {

Model::Model(Vocab vocab) : vocab_(std::move(vocab)) {
  size_t size = 0;
  for (const auto& [token, id] : vocab_) size = std::max(size, static_cast<size_t>(id) + 1);
  id_to_token_.resize(size);
  has_id_.assign(size, false);
  for (const auto& [token, id] : vocab_) {
    id_to_token_[static_cast<size_t>(id)] = token;
    has_id_[static_cast<size_t>(id)] = true;
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

}  // namespace hybridflow::text
