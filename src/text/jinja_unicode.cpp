#include "text/jinja_unicode.h"

#include <cstdint>

namespace hybridflow::text::jinja {

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<unsigned char>(s[i]);
    int extra = 0;
    char32_t cp = 0;
    if (b0 < 0x80) {
      out.push_back(b0);
      ++i;
      continue;
    } else if ((b0 & 0xE0) == 0xC0 && b0 >= 0xC2) {
      extra = 1, cp = b0 & 0x1F;
    } else if ((b0 & 0xF0) == 0xE0) {
      extra = 2, cp = b0 & 0x0F;
    } else if ((b0 & 0xF8) == 0xF0 && b0 <= 0xF4) {
      extra = 3, cp = b0 & 0x07;
    } else {
      out.push_back(0xDC80 + b0);
      ++i;
      continue;
    }
    bool ok = i + static_cast<size_t>(extra) < s.size();  // the continuation bytes exist
    for (int k = 1; ok && k <= extra; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      if ((b & 0xC0) != 0x80) ok = false;
      else cp = (cp << 6) | (b & 0x3F);
    }
    // Overlong forms, surrogates and out-of-range values are invalid too.
    if (ok && ((extra == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (extra == 3 && (cp < 0x10000 || cp > 0x10FFFF))))
      ok = false;
    if (!ok) {
      out.push_back(0xDC80 + b0);
      ++i;
      continue;
    }
    out.push_back(cp);
    i += extra + 1;
  }
  return out;
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) {
      out.push_back(static_cast<char>(c - 0xDC00));  // an escaped invalid byte goes back as that byte
    } else if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

std::int64_t count_code_points(std::string_view s) {
  std::int64_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string strip(std::string_view s, const std::string* chars, bool left, bool right) {
  std::u32string cps = decode_utf8(s);
  std::u32string set;
  if (chars != nullptr) set = decode_utf8(*chars);
  auto strip_it = [&](char32_t c) { return chars == nullptr ? is_space(c) : set.find(c) != std::u32string::npos; };
  size_t begin = 0, end = cps.size();
  if (left)
    while (begin < end && strip_it(cps[begin])) ++begin;
  if (right)
    while (end > begin && strip_it(cps[end - 1])) --end;
  return encode_utf8(std::u32string_view(cps).substr(begin, end - begin));
}

namespace {

// Simple (one-to-one) case pairs of the supported scripts: returns the other case of c, or c.
char32_t upper_of(char32_t c) {
  if (c >= 'a' && c <= 'z') return c - 32;
  if (c < 0x80) return c;
  if (c == 0xB5) return 0x39C;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x100 && c <= 0x17F) {
    if (c == 0x131) return 'I';
    if (c == 0x17F) return 'S';
    if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
      return (c % 2 == 1) ? c - 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 0) ? c - 1 : c;
    return c;
  }
  if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

char32_t lower_of(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c < 0x80) return c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c == 0x178) return 0xFF;
  if (c >= 0x100 && c <= 0x17F) {
    if ((c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
      return (c % 2 == 0) ? c + 1 : c;
    if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c % 2 == 1) ? c + 1 : c;
    return c;
  }
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

bool is_cased(char32_t c) { return upper_of(c) != c || lower_of(c) != c || c == 0xDF || c == 0x130 || c == 0x138; }

// Appends the upper case of c; the few one-to-many mappings Python applies are spelled out.
void append_upper(std::u32string& out, char32_t c) {
  if (c == 0xDF) {
    out += U"SS";
  } else {
    out.push_back(upper_of(c));
  }
}

// Lower case of cps[i]; Greek capital sigma becomes final sigma at the end of a word, as Python does.
void append_lower(std::u32string& out, const std::u32string& cps, size_t i) {
  const char32_t c = cps[i];
  if (c == 0x130) {
    out += U"i\u0307";
  } else if (c == 0x3A3) {
    const bool after_cased = i > 0 && is_cased(cps[i - 1]);
    const bool before_cased = i + 1 < cps.size() && is_cased(cps[i + 1]);
    out.push_back(after_cased && !before_cased ? 0x3C2 : 0x3C3);
  } else {
    out.push_back(lower_of(c));
  }
}

}  // namespace

bool is_upper(char32_t c) { return lower_of(c) != c || c == 0x130; }
bool is_lower(char32_t c) { return upper_of(c) != c || c == 0xDF || c == 0x138; }

std::string to_upper(std::string_view s) {
  std::u32string cps = decode_utf8(s), out;
  for (char32_t c : cps) append_upper(out, c);
  return encode_utf8(out);
}

std::string to_lower(std::string_view s) {
  std::u32string cps = decode_utf8(s), out;
  for (size_t i = 0; i < cps.size(); ++i) append_lower(out, cps, i);
  return encode_utf8(out);
}

std::string capitalize(std::string_view s) {
  std::u32string cps = decode_utf8(s), out;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i == 0) {
      // Python uses the title case of the first character; for these scripts it equals upper, except ß -> Ss.
      if (cps[0] == 0xDF) out += U"Ss";
      else out.push_back(upper_of(cps[0]));
    } else {
      append_lower(out, cps, i);
    }
  }
  return encode_utf8(out);
}

std::string title_case(std::string_view s) {
  std::u32string cps = decode_utf8(s), out;
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (!previous_cased) {
      if (c == 0xDF) out += U"Ss";
      else out.push_back(upper_of(c));
    } else {
      append_lower(out, cps, i);
    }
    previous_cased = is_cased(c);
  }
  return encode_utf8(out);
}

}  // namespace hybridflow::text::jinja
