#include "text/normalizers.h"

#include <utf8proc.h>

namespace hybridflow::text {

std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  size_t pos = text.find(from);
  if (pos == std::string::npos) return text;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t prev = 0;
  while (pos != std::string::npos) {
    out.append(text, prev, pos - prev);
    out += to;
    prev = pos + from.size();
    pos = text.find(from, prev);
  }
  out.append(text, prev, std::string::npos);
  return out;
}

ReplaceNormalizer::ReplaceNormalizer(std::string literal, std::string content)
    : literal_(std::move(literal)), content_(std::move(content)) {}

ReplaceNormalizer::ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
    : regex_(std::move(regex)), content_(std::move(content)) {}

void ReplaceNormalizer::normalize(std::string& text) const {
  if (!regex_) {
    text = replace_all(text, literal_, content_);
    return;
  }
  std::vector<std::pair<size_t, size_t>> matches;
  regex_->find_all(text, matches);
  if (matches.empty()) return;
  std::string out;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    out.append(text, prev, s - prev);
    out += content_;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  text = std::move(out);
}

void StripNormalizer::normalize(std::string& text) const {
  size_t begin = 0, end = text.size();
  if (left_) {
    while (begin < end) {
      size_t len;
      if (!is_whitespace(decode_utf8(text, begin, &len))) break;
      begin += len;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
      size_t len;
      if (!is_whitespace(decode_utf8(text, start, &len))) break;
      end = start;
    }
  }
  text = text.substr(begin, end - begin);
}

namespace {

utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

// Rebuilds text from its code points, each kept, dropped or replaced by `map` (which appends).
template <typename Map>
std::string map_chars(const std::string& text, Map map) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    const char32_t c = decode_utf8(text, i, &len);
    map(c, std::string_view(text).substr(i, len), out);
    i += len;
  }
  return out;
}

// BERT's "Chinese character": the CJK Unified Ideographs blocks and their extensions and compatibility forms.
bool is_cjk_ideograph(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x20000 && c <= 0x2A6DF) ||
         (c >= 0x2A700 && c <= 0x2B73F) || (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B820 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

}  // namespace

void BertNormalizer::normalize(std::string& text) const {
  if (clean_text_) {
    text = map_chars(text, [](char32_t c, std::string_view bytes, std::string& out) {
      // Control characters go first (so U+0085, a control that is also whitespace, is dropped), then
      // whitespace becomes a space; tab, newline and carriage return count as whitespace only.
      const bool tab_or_newline = c == '\t' || c == '\n' || c == '\r';
      const utf8proc_category_t cat = category(c);
      const bool control = !tab_or_newline && (cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
                                               cat == UTF8PROC_CATEGORY_CN || cat == UTF8PROC_CATEGORY_CO);
      if (c == 0 || c == 0xFFFD || control) return;
      if (tab_or_newline || is_whitespace(c)) {
        out += ' ';
        return;
      }
      out += bytes;
    });
  }
  if (chinese_) {
    text = map_chars(text, [](char32_t c, std::string_view bytes, std::string& out) {
      if (is_cjk_ideograph(c)) {
        out += ' ';
        out += bytes;
        out += ' ';
      } else {
        out += bytes;
      }
    });
  }
  if (strip_accents_) {
    // Nonspacing marks only: unlike the StripAccents normalizer, BERT's keeps spacing marks (Mc).
    text = map_chars(normalize_unicode(text, NormalForm::NFD), [](char32_t c, std::string_view bytes, std::string& out) {
      if (c >= 0x80 && category(c) == UTF8PROC_CATEGORY_MN) return;
      out += bytes;
    });
  }
  if (lowercase_) text = to_lower(text);
}

void StripAccentsNormalizer::normalize(std::string& text) const {
  text = map_chars(text, [](char32_t c, std::string_view bytes, std::string& out) {
    // Every combining mark, spacing ones included: the reference's StripAccents drops Devanagari's vowel
    // signs (Mc) too.
    if (c >= 0x80) {
      const utf8proc_category_t cat = category(c);
      if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) return;
    }
    out += bytes;
  });
}

}  // namespace hybridflow::text
