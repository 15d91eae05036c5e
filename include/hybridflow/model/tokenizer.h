// Character-level tokenizer with special tokens, saved as a valid Hugging Face `tokenizers`
// tokenizer.json (a WordLevel model over single characters with a Split pre-tokenizer on every
// character), so that Python's tokenizers/transformers load it too.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace hybridflow {

class Tokenizer {
 public:
  // Special tokens take ids 0..3 (<pad>, <s>, </s>, <unk>); then one id per distinct UTF-8
  // character of `alphabet`, in order of first appearance.
  static Tokenizer from_alphabet(const std::string& alphabet);
  // Reads a tokenizer.json written by save() (throws hybridflow::Error naming the file and field).
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;  // atomic write

  // One id per UTF-8 character; a character outside the vocabulary -> Error naming it and its offset.
  std::vector<int64_t> encode(const std::string& text, bool add_bos = false) const;
  // Ids out of range -> Error. skip_special drops <pad>, <s>, </s>, <unk>.
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t pad_id() const { return pad_id_; }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t unk_id() const { return unk_id_; }
  const std::string& token(int64_t id) const;  // throws on an id out of range

  bool operator==(const Tokenizer& other) const { return id_to_token_ == other.id_to_token_; }

 private:
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int64_t> token_to_id_;
  int64_t pad_id_ = 0, bos_id_ = 1, eos_id_ = 2, unk_id_ = 3;
  static constexpr int64_t kNumSpecial = 4;
};

}  // namespace hybridflow
