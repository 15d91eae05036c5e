// UTF-8 and Unicode helpers with the semantics of Rust's `char`/`str` methods, which the Hugging Face
// tokenizers library relies on (whitespace, alphanumeric, punctuation, lossy decoding).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hybridflow::text {

// Decodes the code point at text[pos] (text must be valid UTF-8) and its length in bytes.
inline char32_t decode_utf8(std::string_view text, size_t pos, size_t* len) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  auto cont = [&](size_t k) { return static_cast<char32_t>(static_cast<unsigned char>(text[pos + k]) & 0x3f); };
  if (b0 < 0xe0) {
    *len = 2;
    return (static_cast<char32_t>(b0 & 0x1f) << 6) | cont(1);
  }
  if (b0 < 0xf0) {
    *len = 3;
    return (static_cast<char32_t>(b0 & 0x0f) << 12) | (cont(1) << 6) | cont(2);
  }
  *len = 4;
  return (static_cast<char32_t>(b0 & 0x07) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

inline size_t utf8_length(unsigned char lead) {
  return lead < 0x80 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
}

void append_utf8(std::string& out, char32_t cp);

// Byte offset of the first invalid UTF-8 sequence, or npos when the text is valid.
size_t find_invalid_utf8(std::string_view text);

// Bytes to text as Rust's String::from_utf8_lossy does: each maximal invalid subsequence becomes U+FFFD.
std::string utf8_lossy(std::string_view bytes);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_whitespace(char32_t c);
// Rust's char::is_numeric (general categories Nd, Nl, No).
bool is_numeric(char32_t c);
// What the tokenizers library calls punctuation: ASCII punctuation or a Unicode P* category.
bool is_punctuation(char32_t c);

// Lowercases each code point on its own (no context such as a final sigma), as the Lowercase normalizer does.
std::string to_lower(std::string_view text);

enum class NormalForm { NFC, NFD, NFKC, NFKD };
std::string normalize_unicode(std::string_view text, NormalForm form);

}  // namespace hybridflow::text
