// The Unicode pieces Python's str methods need: templates index, slice, strip and case-map strings by
// code point, while hybridflow keeps UTF-8 bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace hybridflow::text::jinja {

// Code points of UTF-8 text. A byte that is not valid UTF-8 decodes to U+DC80 + byte (Python's
// surrogateescape) so that encode_utf8(decode_utf8(s)) == s for any bytes.
std::u32string decode_utf8(std::string_view s);
std::string encode_utf8(std::u32string_view s);
std::int64_t count_code_points(std::string_view s);

// Python str.isspace() for one code point (also what re's \s and str.split() treat as whitespace).
bool is_space(char32_t c);

// str.strip / lstrip / rstrip: with chars == nullptr strip whitespace, else any of the code points in *chars.
std::string strip(std::string_view s, const std::string* chars, bool left, bool right);

// Case mapping as Python's str methods do it, from Python's Unicode tables (jinja_case_tables.h).
std::string to_upper(std::string_view s);
std::string to_lower(std::string_view s);
// str.capitalize(): first character upper, the rest lower.
std::string capitalize(std::string_view s);
// str.title(): a cased character after an uncased one becomes upper, the rest lower.
std::string title_case(std::string_view s);
// Whether the code point is upper / lower case (Python's str.isupper / islower of one character).
bool is_upper(char32_t c);
bool is_lower(char32_t c);
// Cased: upper, lower or title case (a title-case letter such as U+01C5 is cased but neither).
bool is_cased(char32_t c);

}  // namespace hybridflow::text::jinja
