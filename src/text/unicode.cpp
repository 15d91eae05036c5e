#include "text/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>

#include "hybridflow/core/error.h"

namespace hybridflow::text {

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

namespace {

// Length of the valid UTF-8 sequence at bytes[pos], or, when it is invalid, minus the length of its
// maximal invalid prefix (the bytes one U+FFFD replaces, per the Unicode "maximal subpart" rule).
long valid_sequence_length(std::string_view bytes, size_t pos) {
  const auto b0 = static_cast<unsigned char>(bytes[pos]);
  if (b0 < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xbf;  // allowed range of the second byte
  if (b0 >= 0xc2 && b0 <= 0xdf) {
    need = 1;
  } else if (b0 >= 0xe0 && b0 <= 0xef) {
    need = 2;
    if (b0 == 0xe0) lo = 0xa0;
    if (b0 == 0xed) hi = 0x9f;
  } else if (b0 >= 0xf0 && b0 <= 0xf4) {
    need = 3;
    if (b0 == 0xf0) lo = 0x90;
    if (b0 == 0xf4) hi = 0x8f;
  } else {
    return -1;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (pos + k >= bytes.size()) return -static_cast<long>(k);
    const auto b = static_cast<unsigned char>(bytes[pos + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xbf;
    if (b < l || b > h) return -static_cast<long>(k);
  }
  return static_cast<long>(need + 1);
}

}  // namespace

size_t find_invalid_utf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {
      ++i;
      continue;
    }
    const long n = valid_sequence_length(text, i);
    if (n < 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

std::string utf8_lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t i = 0;
  while (i < bytes.size()) {
    const long n = valid_sequence_length(bytes, i);
    if (n > 0) {
      out.append(bytes.data() + i, static_cast<size_t>(n));
      i += static_cast<size_t>(n);
    } else {
      out += "\xef\xbf\xbd";
      i += static_cast<size_t>(-n);
    }
  }
  return out;
}

bool is_whitespace(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0d);
  switch (c) {
    case 0x85: case 0xa0: case 0x1680: case 0x2028: case 0x2029: case 0x202f: case 0x205f: case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200a;
  }
}

bool is_numeric(char32_t c) {
  if (c < 0x80) return c >= '0' && c <= '9';
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

bool is_punctuation(char32_t c) {
  if (c < 0x80) return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
                       (c >= 0x7b && c <= 0x7e);
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC: case UTF8PROC_CATEGORY_PD: case UTF8PROC_CATEGORY_PS: case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI: case UTF8PROC_CATEGORY_PF: case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

std::string to_lower(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    size_t len;
    const char32_t c = decode_utf8(text, i, &len);
    i += len;
    if (c < 0x80) {
      out += static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
    } else if (c == 0x130) {
      out += "i\xcc\x87";  // the one code point whose full lowercase mapping is two code points
    } else {
      append_utf8(out, static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

std::string normalize_unicode(std::string_view text, NormalForm form) {
  bool ascii = true;
  for (char ch : text) ascii = ascii && static_cast<unsigned char>(ch) < 0x80;
  if (ascii) return std::string(text);  // every normal form leaves ASCII unchanged
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::NFC: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::NFD: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::NFKC: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::NFKD: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                          static_cast<utf8proc_ssize_t>(text.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  HF_CHECK(n >= 0, "Unicode normalisation failed: ", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

}  // namespace hybridflow::text
