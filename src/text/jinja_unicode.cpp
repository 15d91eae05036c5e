#include "text/jinja_unicode.h"

#include <algorithm>
#include <cstdint>

#include "text/jinja_case_tables.h"

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

using namespace case_tables;

char32_t map_by_runs(const CaseRun* runs, std::size_t count, char32_t c) {
  // The last run starting at or before c.
  const CaseRun* it = std::upper_bound(runs, runs + count, c, [](char32_t v, const CaseRun& r) { return v < r.start; });
  if (it == runs) return c;
  const CaseRun& r = *(it - 1);
  if (c > r.end || (c - r.start) % static_cast<char32_t>(r.stride) != 0) return c;
  return static_cast<char32_t>(static_cast<std::int64_t>(c) + r.delta);
}

const char32_t* special_mapping(const CaseSpecial* specials, std::size_t count, char32_t c) {
  const CaseSpecial* it = std::lower_bound(specials, specials + count, c,
                                           [](const CaseSpecial& s, char32_t v) { return s.code_point < v; });
  return it != specials + count && it->code_point == c ? it->mapping : nullptr;
}

bool in_ranges(const CodePointRange* ranges, std::size_t count, char32_t c) {
  const CodePointRange* it =
      std::upper_bound(ranges, ranges + count, c, [](char32_t v, const CodePointRange& r) { return v < r.first; });
  return it != ranges && c <= (it - 1)->last;
}

void append_mapped(std::u32string& out, char32_t c, const CaseRun* runs, std::size_t run_count,
                   const CaseSpecial* specials, std::size_t special_count) {
  if (const char32_t* m = special_mapping(specials, special_count, c)) {
    out += m;
  } else {
    out.push_back(map_by_runs(runs, run_count, c));
  }
}

void append_upper(std::u32string& out, char32_t c) {
  append_mapped(out, c, upper_runs, upper_run_count, upper_specials, upper_special_count);
}
void append_title(std::u32string& out, char32_t c) {
  append_mapped(out, c, title_runs, title_run_count, title_specials, title_special_count);
}

// Lower case of cps[i]; Greek capital sigma becomes final sigma at the end of a word, as Python does
// (Python also skips case-ignorable characters such as apostrophes when looking around; this does not).
void append_lower(std::u32string& out, const std::u32string& cps, size_t i) {
  const char32_t c = cps[i];
  if (c == 0x3A3) {
    const bool after_cased = i > 0 && is_cased(cps[i - 1]);
    const bool before_cased = i + 1 < cps.size() && is_cased(cps[i + 1]);
    out.push_back(after_cased && !before_cased ? 0x3C2 : 0x3C3);
    return;
  }
  append_mapped(out, c, lower_runs, lower_run_count, lower_specials, lower_special_count);
}

}  // namespace

bool is_cased(char32_t c) { return in_ranges(cased_ranges, cased_range_count, c); }
bool is_upper(char32_t c) { return in_ranges(uppercase_ranges, uppercase_range_count, c); }
bool is_lower(char32_t c) { return in_ranges(lowercase_ranges, lowercase_range_count, c); }

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
    if (i == 0) append_title(out, cps[0]);  // Python capitalizes with the title case of the first character
    else append_lower(out, cps, i);
  }
  return encode_utf8(out);
}

std::string title_case(std::string_view s) {
  std::u32string cps = decode_utf8(s), out;
  bool previous_cased = false;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (previous_cased) append_lower(out, cps, i);
    else append_title(out, c);
    previous_cased = is_cased(c);
  }
  return encode_utf8(out);
}

}  // namespace hybridflow::text::jinja
