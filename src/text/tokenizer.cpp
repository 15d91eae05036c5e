#include "hybridflow/text/tokenizer.h"

#include <algorithm>

#include "hybridflow/core/error.h"
#include "text/tokenizer_impl.h"
#include "text/unicode.h"

namespace hybridflow::text {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

void Tokenizer::Impl::pieces_of(std::string_view text, std::vector<std::pair<Piece, int32_t>>& out) const {
  const size_t invalid = find_invalid_utf8(text);
  HF_CHECK(invalid == std::string_view::npos, "tokenizer input: invalid UTF-8 at byte offset ", invalid);
  // Added tokens that match the raw input come out first; the rest is normalized, then searched for
  // the added tokens that match normalized text. Empty pieces go no further.
  for (const Segment& seg : raw_matcher->split(text)) {
    if (seg.token_id >= 0) {
      out.push_back({Piece{}, seg.token_id});
      continue;
    }
    if (seg.end == seg.start) continue;
    std::string normalized(text.substr(seg.start, seg.end - seg.start));
    if (normalizer) normalizer->normalize(normalized);
    if (normalized.empty()) continue;
    const bool at_input_start = seg.start == 0;
    if (normalized_matcher->empty()) {
      out.push_back({Piece{std::move(normalized), at_input_start}, -1});
      continue;
    }
    for (const Segment& sub : normalized_matcher->split(normalized)) {
      if (sub.token_id >= 0) {
        out.push_back({Piece{}, sub.token_id});
      } else if (sub.end > sub.start) {
        out.push_back({Piece{normalized.substr(sub.start, sub.end - sub.start), at_input_start && sub.start == 0}, -1});
      }
    }
  }
}

void Tokenizer::Impl::encode_sequence(std::string_view text, std::vector<int32_t>& ids) const {
  std::vector<std::pair<Piece, int32_t>> parts;
  pieces_of(text, parts);
  std::vector<Piece> words;
  for (auto& [piece, token_id] : parts) {
    if (token_id >= 0) {
      ids.push_back(token_id);
      continue;
    }
    words.clear();
    words.push_back(std::move(piece));
    if (pre_tokenizer) pre_tokenizer->pre_tokenize(words);
    for (const Piece& word : words) model->tokenize(word.text, ids);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  Encodings encodings(1);
  impl_->encode_sequence(text, encodings[0]);
  if (impl_->post_processor) impl_->post_processor->process(encodings, add_special_tokens);
  return std::move(encodings[0]);
}

std::vector<int32_t> Tokenizer::encode_pair(std::string_view first, std::string_view second,
                                            bool add_special_tokens) const {
  Encodings encodings(2);
  impl_->encode_sequence(first, encodings[0]);
  impl_->encode_sequence(second, encodings[1]);
  if (impl_->post_processor) impl_->post_processor->process(encodings, add_special_tokens);
  std::vector<int32_t> out;
  for (const auto& e : encodings) out.insert(out.end(), e.begin(), e.end());
  return out;
}

std::vector<std::string> Tokenizer::tokens(const std::vector<int32_t>& ids) const {
  std::vector<std::string> out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    auto token = id_to_token(id);
    HF_CHECK(token.has_value(), "token id ", id, " out of range [0, ", vocab_size(), ")");
    out.push_back(std::move(*token));
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> toks;
  toks.reserve(ids.size());
  for (int32_t id : ids) {
    auto token = id_to_token(id);
    HF_CHECK(token.has_value(), "token id ", id, " out of range [0, ", vocab_size(), ")");
    if (skip_special_tokens && is_special(id)) continue;
    toks.push_back(std::move(*token));
  }
  if (!impl_->decoder) {
    std::string out;
    for (size_t i = 0; i < toks.size(); ++i) out += (i ? " " : "") + toks[i];
    return out;
  }
  impl_->decoder->decode(toks);
  std::string out;
  for (const std::string& t : toks) out += t;
  return out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string out(text);
  if (impl_->normalizer) impl_->normalizer->normalize(out);
  return out;
}

std::vector<std::string> Tokenizer::pre_tokenize(std::string_view text) const {
  std::vector<Piece> pieces;
  if (!text.empty()) pieces.push_back(Piece{std::string(text), true});  // empty pieces never reach a pre-tokenizer
  if (impl_->pre_tokenizer) impl_->pre_tokenizer->pre_tokenize(pieces);
  std::vector<std::string> out;
  for (Piece& p : pieces) out.push_back(std::move(p.text));
  return out;
}

std::optional<int32_t> Tokenizer::token_to_id(std::string_view token) const {
  auto it = impl_->added_by_content.find(token);
  if (it != impl_->added_by_content.end()) return it->second;
  return impl_->model->token_to_id(token);
}

std::optional<std::string> Tokenizer::id_to_token(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  if (it != impl_->added_by_id.end()) return impl_->added_tokens[it->second].token_text;
  if (const std::string* token = impl_->model->id_to_token(id)) return *token;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  auto it = impl_->added_by_id.find(id);
  return it != impl_->added_by_id.end() && impl_->added_tokens[it->second].special;
}

int32_t Tokenizer::vocab_size() const {
  auto size = static_cast<int32_t>(impl_->model->id_limit());
  for (const AddedToken& t : impl_->added_tokens) size = std::max(size, t.id + 1);
  return size;
}

}  // namespace hybridflow::text
