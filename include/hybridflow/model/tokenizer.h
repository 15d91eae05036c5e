// The project's tokenizer. from_alphabet() makes a character-level one with special tokens, saved as
// a valid Hugging Face `tokenizers` tokenizer.json (a WordLevel model over single characters with a
// Split pre-tokenizer on every character), so that Python's tokenizers/transformers load it too.
// load() also reads any published tokenizer.json the text layer supports (GPT-2, Llama, Qwen, ...),
// encoding exactly as the `tokenizers` library does (hybridflow/text/tokenizer.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

namespace hybridflow {

class Tokenizer {
 public:
  // Special tokens take ids 0..3 (<pad>, <s>, </s>, <unk>); then one id per distinct UTF-8
  // character of `alphabet`, in order of first appearance.
  static Tokenizer from_alphabet(const std::string& alphabet);
  // Reads a tokenizer.json (throws hybridflow::Error naming the file and field). One written by
  // save() for a character-level tokenizer is read strictly as such. Any other goes through the text
  // layer; its pad/bos/eos/unk ids then come from tokenizer_config.json beside it (-1 when absent).
  static Tokenizer load(const std::string& path);
  // Atomic write. A loaded published tokenizer writes back the files it was read from (and
  // tokenizer_config.json and generation_config.json beside `path` when there were).
  void save(const std::string& path) const;

  // Character-level: one id per UTF-8 character; a character outside the vocabulary -> Error naming
  // it and its offset. Published tokenizers: the reference library's ids; add_bos applies the
  // post-processor's special tokens (e.g. a TemplateProcessing's <s>), without it none are added.
  std::vector<int64_t> encode(const std::string& text, bool add_bos = false) const;
  // Ids out of range -> Error. skip_special drops the special tokens (<pad>, <s>, </s>, <unk>).
  std::string decode(const std::vector<int64_t>& ids, bool skip_special = true) const;

  int64_t vocab_size() const { return static_cast<int64_t>(id_to_token_.size()); }
  int64_t pad_id() const { return pad_id_; }
  int64_t bos_id() const { return bos_id_; }
  int64_t eos_id() const { return eos_id_; }
  int64_t unk_id() const { return unk_id_; }
  const std::string& token(int64_t id) const;  // throws on an id out of range
  // A published tokenizer's directory may ship generation_config.json (eos list, sampling defaults): its
  // text as read, so that a model saved with this tokenizer keeps it; empty otherwise.
  const std::string& source_generation_config() const;

  bool operator==(const Tokenizer& other) const { return id_to_token_ == other.id_to_token_; }

 private:
  std::vector<std::string> id_to_token_;
  std::unordered_map<std::string, int64_t> token_to_id_;
  int64_t pad_id_ = 0, bos_id_ = 1, eos_id_ = 2, unk_id_ = 3;
  static constexpr int64_t kNumSpecial = 4;
  static Tokenizer load_published(const std::string& path, std::string bytes);
  // Set for a published tokenizer.json: the text layer's tokenizer and the files it came from.
  struct Published;
  std::shared_ptr<const Published> published_;
};

}  // namespace hybridflow
