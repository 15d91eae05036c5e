#include "text/regex.h"

#include <oniguruma.h>

#include <cstring>
#include <mutex>

#include "hybridflow/core/error.h"
#include "text/unicode.h"

namespace hybridflow::text {
namespace {

void initialize_oniguruma() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

std::string onig_message(int code, OnigErrorInfo* info) {
  OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
  const int n = info != nullptr ? onig_error_code_to_str(buf, code, info) : onig_error_code_to_str(buf, code);
  return std::string(reinterpret_cast<const char*>(buf), static_cast<size_t>(n > 0 ? n : 0));
}

}  // namespace

Regex::Regex(const std::string& pattern, bool use_scanner)
    : scanner_(use_scanner ? WordScanner::for_pattern(pattern) : nullptr) {
  initialize_oniguruma();
  OnigRegex re = nullptr;
  OnigErrorInfo info;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  const int rc = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
  HF_CHECK(rc == ONIG_NORMAL, "invalid regular expression '", pattern, "': ", onig_message(rc, &info));
  regex_ = re;
}

Regex::~Regex() {
  if (regex_ != nullptr) onig_free(static_cast<OnigRegex>(regex_));
}

void Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (scanner_ && scanner_->find_all(text, out)) return;
  auto* re = static_cast<OnigRegex>(regex_);
  OnigRegion* region = onig_region_new();
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  size_t from = 0;
  bool matched_before = false;
  size_t last_match_end = 0;
  while (from <= text.size()) {
    const int pos = onig_search(re, begin, end, begin + from, end, region, ONIG_OPTION_NONE);
    if (pos < 0) {
      if (pos != ONIG_MISMATCH) {
        onig_region_free(region, 1);
        HF_FAIL("regular expression search failed: ", onig_message(pos, nullptr));
      }
      break;
    }
    const auto s = static_cast<size_t>(region->beg[0]), e = static_cast<size_t>(region->end[0]);
    if (s == e && matched_before && last_match_end == e) {
      // An empty match where the last one ended: step one character on, or stop at the end.
      if (from >= text.size()) break;
      from += utf8_length(static_cast<unsigned char>(text[from]));
      continue;
    }
    out.emplace_back(s, e);
    matched_before = true;
    last_match_end = e;
    from = e;
    if (s == e && e >= text.size()) break;
  }
  onig_region_free(region, 1);
}

std::string Regex::escape(std::string_view literal) {
  // The characters the reference escapes (Rust's regex::escape); each is a plain escape in Oniguruma.
  static constexpr std::string_view kMeta = "\\.+*?()|[]{}^$#&-~";
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    if (kMeta.find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

bool is_regex_word_char(char32_t c) {
  if (c < 0x80) return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') || c == '_';
  struct Ctypes {
    unsigned ctypes[5];
    Ctypes() {
      initialize_oniguruma();
      OnigEncoding enc = ONIG_ENCODING_UTF8;
      const char* names[5] = {"Alphabetic", "M", "Nd", "Pc", "Join_Control"};
      for (int i = 0; i < 5; ++i) {
        auto* p = reinterpret_cast<OnigUChar*>(const_cast<char*>(names[i]));
        ctypes[i] = static_cast<unsigned>(ONIGENC_PROPERTY_NAME_TO_CTYPE(enc, p, p + std::strlen(names[i])));
      }
    }
  };
  static const Ctypes table;
  for (unsigned ctype : table.ctypes)
    if (ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, c, ctype)) return true;
  return false;
}

}  // namespace hybridflow::text
