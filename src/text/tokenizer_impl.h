// The parts of a loaded tokenizer, which tokenizer_json.cpp assembles and tokenizer.cpp runs.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "hybridflow/text/tokenizer.h"
#include "text/added_vocabulary.h"
#include "text/decoders.h"
#include "text/model.h"
#include "text/normalizers.h"
#include "text/post_processors.h"
#include "text/pre_tokenizers.h"

namespace hybridflow::text {

struct Tokenizer::Impl {
  std::unique_ptr<Normalizer> normalizer;       // may be null
  std::unique_ptr<PreTokenizer> pre_tokenizer;  // may be null
  std::unique_ptr<Model> model;
  std::unique_ptr<PostProcessor> post_processor;  // may be null
  std::unique_ptr<Decoder> decoder;               // may be null: tokens joined by spaces
  std::vector<AddedToken> added_tokens;
  std::unordered_map<int32_t, size_t> added_by_id;  // index into added_tokens
  Vocab added_by_content;
  std::unique_ptr<AddedTokenMatcher> raw_matcher;         // normalized=false tokens, in the input
  std::unique_ptr<AddedTokenMatcher> normalized_matcher;  // normalized=true tokens, in normalized text

  // Appends the ids of one sequence, before post-processing.
  void encode_sequence(std::string_view text, std::vector<int32_t>& ids) const;
  // The pieces the model would see, with added tokens as their ids (text empty).
  void pieces_of(std::string_view text, std::vector<std::pair<Piece, int32_t>>& out) const;
};

// Builds a Tokenizer from its parts (tokenizer_json.cpp's way in).
struct TokenizerBuilder {
  static Tokenizer build(std::unique_ptr<Tokenizer::Impl> impl) { return Tokenizer(std::move(impl)); }
};

}  // namespace hybridflow::text
