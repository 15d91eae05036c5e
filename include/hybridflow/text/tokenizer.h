// A Hugging Face `tokenizers` tokenizer, read from its tokenizer.json: the same pipeline as the
// reference library (added tokens, normalizer, pre-tokenizer, model, post-processor, decoder) and
// the same ids. Components or options it does not implement are load errors, never a silent
// difference. Plain C++ (no libtorch), safe to share between threads once loaded.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace hybridflow::text {

class Tokenizer {
 public:
  // Throws hybridflow::Error naming the file, and for a bad or unsupported component its JSON path
  // (e.g. "pre_tokenizer.pretokenizers[1].type") and value.
  static Tokenizer from_file(const std::string& path);
  // `source` names the text in error messages.
  static Tokenizer from_json(const std::string& json_text, const std::string& source);

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // The ids of `text` (valid UTF-8, else an Error). add_special_tokens applies the post-processor's
  // special tokens (e.g. a TemplateProcessing's BOS), as the reference's encode does.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = true) const;
  std::vector<int32_t> encode_pair(std::string_view first, std::string_view second,
                                   bool add_special_tokens = true) const;
  // Text of ids; an id with no token is an Error. skip_special_tokens drops special added tokens.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = true) const;

  // The pipeline's stages on their own (what tests compare with the reference's stages).
  std::string normalize(std::string_view text) const;
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  std::vector<std::string> tokens(const std::vector<int32_t>& ids) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;
  std::optional<std::string> id_to_token(int32_t id) const;
  bool is_special(int32_t id) const;
  // One more than the largest id of the model or the added tokens.
  int32_t vocab_size() const;

  struct Impl;  // the loaded pipeline (src/text/tokenizer_impl.h)

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
  friend struct TokenizerBuilder;
};

}  // namespace hybridflow::text
