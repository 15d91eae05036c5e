// A model turns one pre-tokenized word into token ids, and maps ids and tokens both ways.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hybridflow::text {

// Hash and equality that let a map keyed by std::string be searched with a std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using Vocab = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

class Model {
 public:
  virtual ~Model() = default;
  // Appends the ids of `word` to `ids`.
  virtual void tokenize(std::string_view word, std::vector<int32_t>& ids) const = 0;

  std::optional<int32_t> token_to_id(std::string_view token) const {
    auto it = vocab_.find(token);
    if (it == vocab_.end()) return std::nullopt;
    return it->second;
  }
  // Null when the model has no token with that id.
  const std::string* id_to_token(int32_t id) const {
    if (id < 0 || static_cast<size_t>(id) >= id_to_token_.size()) return nullptr;
    return id_to_token_[static_cast<size_t>(id)];
  }
  size_t vocab_size() const { return vocab_.size(); }
  size_t id_limit() const { return id_to_token_.size(); }  // one more than the largest id

 protected:
  // Takes the vocabulary and builds the reverse map (ids may have gaps).
  explicit Model(Vocab vocab);
  // The reverse map points into vocab_'s nodes, so a model is never copied.
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Vocab vocab_;
  std::vector<const std::string*> id_to_token_;  // null where no token has the id
};

// Whole words looked up in the vocabulary; others become unk_token (an error when there is none).
class WordLevelModel : public Model {
 public:
  WordLevelModel(Vocab vocab, std::optional<int32_t> unk_id) : Model(std::move(vocab)), unk_id_(unk_id) {}
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const override;

 private:
  std::optional<int32_t> unk_id_;
};

// BERT's: each word split greedily into the longest vocabulary pieces from the left, pieces after the
// first carrying the continuation prefix ("##"); a word that cannot be split, or that is longer than
// max_chars characters, is the unk token.
class WordPieceModel : public Model {
 public:
  WordPieceModel(Vocab vocab, int32_t unk_id, std::string prefix, size_t max_chars)
      : Model(std::move(vocab)), unk_id_(unk_id), prefix_(std::move(prefix)), max_chars_(max_chars) {}
  void tokenize(std::string_view word, std::vector<int32_t>& ids) const override;

 private:
  int32_t unk_id_;
  std::string prefix_;
  size_t max_chars_;
};

}  // namespace hybridflow::text
