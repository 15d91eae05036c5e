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
  // Special tokens take ids 0..2 (pad, bos, eos); then one id per character of `alphabet`.
  static Tokenizer from_alphabet(const std::string& alphabet);
  // Reads a tokenizer.json written by save() (throws hybridflow::Error naming the file and field).
  static Tokenizer load(const std::string& path);
  void save(const std::string& path) const;  // atomic write

  std::vector<int64_t> encode(const std::string& text, bool add_bos = false) const;  // unknown char -> Error
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t pad_id() const { return pad_id_; }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }

 private:
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int64_t> token_to_id_;
  int64_t pad_id_ = 0, bos_id_ = 1, eos_id_ = 2;
};

}  // namespace hybridflow
