#include "text/word_scanner.h"

#include <oniguruma.h>

#include <array>
#include <climits>

#include "text/pre_tokenizers.h"
#include "text/unicode.h"

namespace hybridflow::text {
namespace {

const char* const kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

enum Class : unsigned char { kOther, kLetter, kNumber, kSpace };

// \p{L}, \p{N} and \s as Oniguruma decides them (its Unicode tables), cached for ASCII.
class CharClasses {
 public:
  static const CharClasses& get() {
    static const CharClasses classes;
    return classes;
  }
  Class of(char32_t c) const { return c < 128 ? ascii_[c] : lookup(c); }

 private:
  CharClasses() {
    OnigEncoding enc = ONIG_ENCODING_UTF8;
    auto ctype = [&](const char* name) {
      const auto* p = reinterpret_cast<const OnigUChar*>(name);
      return ONIGENC_PROPERTY_NAME_TO_CTYPE(enc, const_cast<OnigUChar*>(p), const_cast<OnigUChar*>(p) + std::char_traits<char>::length(name));
    };
    letter_ = static_cast<unsigned>(ctype("L"));
    number_ = static_cast<unsigned>(ctype("N"));
    for (char32_t c = 0; c < 128; ++c) ascii_[c] = lookup(c);
  }
  Class lookup(char32_t c) const {
    OnigEncoding enc = ONIG_ENCODING_UTF8;
    if (ONIGENC_IS_CODE_CTYPE(enc, c, letter_)) return kLetter;
    if (ONIGENC_IS_CODE_CTYPE(enc, c, number_)) return kNumber;
    if (ONIGENC_IS_CODE_CTYPE(enc, c, ONIGENC_CTYPE_SPACE)) return kSpace;
    return kOther;
  }
  unsigned letter_ = 0, number_ = 0;
  std::array<Class, 128> ascii_{};
};

// The text as code points with their classes, walked by byte offset.
struct Cursor {
  std::string_view text;
  const CharClasses& classes;

  bool at_end(size_t pos) const { return pos >= text.size(); }
  // Class and byte length of the character at pos (pos < size).
  Class cls(size_t pos, size_t* len) const {
    const auto b = static_cast<unsigned char>(text[pos]);
    if (b < 0x80) {
      *len = 1;
      return classes.of(b);
    }
    return classes.of(decode_utf8(text, pos, len));
  }
  Class cls(size_t pos) const {
    size_t len;
    return cls(pos, &len);
  }
  size_t next(size_t pos) const { return pos + utf8_length(static_cast<unsigned char>(text[pos])); }
  // End of the run of characters of class k starting at pos, at most `limit` characters.
  size_t run(size_t pos, Class k, long limit = LONG_MAX) const {
    while (limit > 0 && !at_end(pos)) {
      size_t len;
      if (cls(pos, &len) != k) break;
      pos += len;
      --limit;
    }
    return pos;
  }
  bool is(size_t pos, char c) const { return !at_end(pos) && text[pos] == c; }
  bool is_newline(size_t pos) const { return is(pos, '\r') || is(pos, '\n'); }
};

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c; }

// The end of 's 't 're 've 'm 'll 'd at pos (just after the apostrophe), or 0 when none matches.
// With `ignore_case`, a non-ASCII letter there sets *undecided (Unicode case folding is the regex
// engine's business).
size_t contraction_end(const Cursor& t, size_t pos, bool ignore_case, bool* undecided) {
  auto letter = [&](size_t p, char want) {
    if (t.at_end(p)) return false;
    const char c = t.text[p];
    if (ignore_case && static_cast<unsigned char>(c) >= 0x80) *undecided = true;
    return (ignore_case ? ascii_lower(c) : c) == want;
  };
  if (letter(pos, 's') || letter(pos, 't') || letter(pos, 'm') || letter(pos, 'd')) return pos + 1;
  if ((letter(pos, 'r') || letter(pos, 'v')) && letter(pos + 1, 'e')) return pos + 2;
  if (letter(pos, 'l') && letter(pos + 1, 'l')) return pos + 2;
  return 0;
}

// \s+(?!\S) then \s+, for the whitespace run [pos, end): all of it when it ends the text, else all
// but its last character (which is left to precede the next word), else (one character) all of it.
size_t whitespace_end(const Cursor& t, size_t pos, size_t end) {
  if (t.at_end(end)) return end;
  size_t last = end - 1;
  while ((static_cast<unsigned char>(t.text[last]) & 0xc0) == 0x80) --last;
  return last > pos ? last : end;
}

}  // namespace

std::unique_ptr<WordScanner> WordScanner::for_pattern(const std::string& pattern) {
  if (pattern == kGpt2WordPattern) return std::unique_ptr<WordScanner>(new WordScanner(Kind::Gpt2, INT_MAX));
  if (pattern == kLlama3Pattern) return std::unique_ptr<WordScanner>(new WordScanner(Kind::Llama3, 3));
  if (pattern == kQwen2Pattern) return std::unique_ptr<WordScanner>(new WordScanner(Kind::Llama3, 1));
  return nullptr;
}

bool WordScanner::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  const Cursor t{text, CharClasses::get()};
  const size_t mark = out.size();
  size_t pos = 0;
  while (pos < text.size()) {
    size_t len0;
    const Class k0 = t.cls(pos, &len0);
    const size_t after = pos + len0;
    size_t end = 0;
    if (kind_ == Kind::Gpt2) {
      // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
      bool undecided = false;
      if (text[pos] == '\'') end = contraction_end(t, after, false, &undecided);
      if (end == 0) {
        const bool space = text[pos] == ' ' && !t.at_end(after);
        const Class k = space ? t.cls(after) : k0;
        const size_t from = space ? after : pos;
        if (k == kLetter || k == kNumber || k == kOther) {
          if (space || k0 != kSpace) end = t.run(from, k);
        }
        if (end == 0 && k0 == kSpace) end = whitespace_end(t, pos, t.run(pos, kSpace));
        if (end == 0) end = t.run(pos, k0);  // a lone space before a space: \s+
      }
    } else {
      // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,n}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
      bool undecided = false;
      if (text[pos] == '\'') end = contraction_end(t, after, true, &undecided);
      if (undecided) {
        out.resize(mark);
        return false;
      }
      if (end == 0) {
        if (k0 == kLetter) {
          end = t.run(pos, kLetter);
        } else if (k0 != kNumber && !t.is_newline(pos) && !t.at_end(after) && t.cls(after) == kLetter) {
          end = t.run(after, kLetter);
        } else if (k0 == kNumber) {
          end = t.run(pos, kNumber, max_digits_);
        } else {
          const bool space = text[pos] == ' ' && !t.at_end(after) && t.cls(after) == kOther;
          if (space || k0 == kOther) {
            end = t.run(space ? after : pos, kOther);
            while (t.is_newline(end)) ++end;
          } else {  // whitespace
            const size_t run_end = t.run(pos, kSpace);
            size_t last_newline = 0;
            for (size_t p = pos; p < run_end; p = t.next(p))
              if (t.is_newline(p)) last_newline = p + 1;
            end = last_newline != 0 ? last_newline : whitespace_end(t, pos, run_end);
          }
        }
      }
    }
    out.emplace_back(pos, end);
    pos = end;
  }
  return true;
}

}  // namespace hybridflow::text
