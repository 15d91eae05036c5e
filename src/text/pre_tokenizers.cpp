#include "text/pre_tokenizers.h"

#include "text/byte_level.h"
#include "text/normalizers.h"
#include "text/unicode.h"

namespace hybridflow::text {

const char* const kGpt2WordPattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The reference writes \w+|[^\w\s]+ for the Rust regex crate, whose \w differs from Oniguruma's (it
// includes Join_Control such as U+200D and excludes No such as "²"): spelled out here with its definition.
const char* const kWhitespaceWordPattern =
    R"([\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]+|[^\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}\p{White_Space}]+)";

namespace {

void split_with_regex(const Regex& regex, std::vector<Piece>& pieces, SplitBehavior behavior, bool invert) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  std::vector<std::pair<size_t, size_t>> matches;
  for (const Piece& piece : pieces) {
    matches.clear();
    regex.find_all(piece.text, matches);
    split_piece(piece, spans_around(piece.text, matches), behavior, invert, out);
  }
  pieces = std::move(out);
}

}  // namespace

ByteLevelPreTokenizer::ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex)
    : add_prefix_space_(add_prefix_space), regex_(use_regex ? std::make_unique<Regex>(kGpt2WordPattern) : nullptr) {}

void ByteLevelPreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  if (add_prefix_space_) {
    for (Piece& p : pieces)
      if (p.text.empty() || p.text[0] != ' ') p.text.insert(0, " ");
  }
  if (regex_) split_with_regex(*regex_, pieces, SplitBehavior::Isolated, false);
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  std::string mapped;
  for (Piece& p : pieces) {
    mapped.clear();
    alphabet.encode(p.text, mapped);
    p.text.swap(mapped);
  }
}

void SplitPreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  split_with_regex(*regex_, pieces, behavior_, invert_);
}

void CharSplitPreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  std::vector<std::pair<size_t, size_t>> matches;
  for (const Piece& piece : pieces) {
    matches.clear();
    size_t i = 0;
    while (i < piece.text.size()) {
      size_t len;
      const char32_t c = decode_utf8(piece.text, i, &len);
      const bool hit = kind_ == Kind::Whitespace    ? is_whitespace(c)
                       : kind_ == Kind::Punctuation ? is_punctuation(c)
                                                    : is_numeric(c);
      if (hit) matches.emplace_back(i, i + len);
      i += len;
    }
    split_piece(piece, spans_around(piece.text, matches), behavior_, false, out);
  }
  pieces = std::move(out);
}

void MetaspacePreTokenizer::pre_tokenize(std::vector<Piece>& pieces) const {
  std::vector<Piece> out;
  std::vector<std::pair<size_t, size_t>> matches;
  for (Piece& piece : pieces) {
    piece.text = replace_all(piece.text, " ", replacement_);
    const bool starts_with_replacement = piece.text.compare(0, replacement_.size(), replacement_) == 0;
    if (!starts_with_replacement &&
        (scheme_ == PrependScheme::Always || (scheme_ == PrependScheme::First && piece.at_input_start)))
      piece.text.insert(0, replacement_);
    if (!split_) {
      out.push_back(std::move(piece));
      continue;
    }
    matches.clear();
    for (size_t pos = piece.text.find(replacement_); pos != std::string::npos;
         pos = piece.text.find(replacement_, pos + replacement_.size()))
      matches.emplace_back(pos, pos + replacement_.size());
    split_piece(piece, spans_around(piece.text, matches), SplitBehavior::MergedWithNext, false, out);
  }
  pieces = std::move(out);
}

}  // namespace hybridflow::text
