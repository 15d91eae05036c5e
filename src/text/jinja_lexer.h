// Splits a Jinja template into tokens the way jinja2's lexer does with transformers' settings
// (trim_blocks, lstrip_blocks, keep_trailing_newline off): template text with the whitespace control
// (`{%-`, `-%}`, `+`) already applied, then the tokens inside each `{{ }}` and `{% %}` tag. Comments
// and `{% raw %}` are resolved here, so the parser sees only text, tag delimiters and expression tokens.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hybridflow::text::jinja {

struct Location {
  int line = 0;
  int column = 0;
};

struct Token {
  enum class Type { Text, VariableBegin, VariableEnd, BlockBegin, BlockEnd, Name, String, Integer, Float, Operator, End };
  Type type;
  std::string text;  // the text, name, unescaped string, number spelling (no '_') or operator
  Location location;
};

// Throws TemplateError (with the position) on an unterminated tag, comment or string, or an unknown character.
std::vector<Token> tokenize(const std::string& source);

}  // namespace hybridflow::text::jinja
