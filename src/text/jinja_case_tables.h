// Python's Unicode case data (generated into jinja_case_tables.cpp by scripts/gen_jinja_case_tables.py),
// so upper/lower/title/capitalize in templates change the same characters transformers' Python does.
#pragma once

#include <cstddef>
#include <cstdint>

namespace hybridflow::text::jinja::case_tables {

// Code points start, start + stride, ..., end map to code point + delta.
struct CaseRun {
  char32_t start;
  char32_t end;
  std::int32_t stride;
  std::int32_t delta;
};

// A code point whose mapping is several code points (e.g. U+00DF to "SS").
struct CaseSpecial {
  char32_t code_point;
  const char32_t* mapping;
};

struct CodePointRange {
  char32_t first;
  char32_t last;
};

extern const CaseRun upper_runs[], lower_runs[], title_runs[];
extern const std::size_t upper_run_count, lower_run_count, title_run_count;
extern const CaseSpecial upper_specials[], lower_specials[], title_specials[];
extern const std::size_t upper_special_count, lower_special_count, title_special_count;
// Python's notion of cased (str.isupper / islower / istitle of one character), uppercase and lowercase.
extern const CodePointRange cased_ranges[], uppercase_ranges[], lowercase_ranges[];
extern const std::size_t cased_range_count, uppercase_range_count, lowercase_range_count;

}  // namespace hybridflow::text::jinja::case_tables
