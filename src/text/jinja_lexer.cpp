#include "text/jinja_lexer.h"

#include <algorithm>
#include <cstdint>

#include "hybridflow/text/template_error.h"
#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {
namespace {

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_name_char(char c) { return is_name_start(c) || is_digit(c); }

// Length in bytes of the whitespace (Python's \s, so Unicode spaces too) starting at `pos`.
size_t whitespace_run(const std::string& s, size_t pos) {
  size_t i = pos;
  while (i < s.size()) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      if (!is_ascii_space(s[i]) && !(c >= 0x1C && c <= 0x1F)) break;
      ++i;
      continue;
    }
    size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 1;
    std::u32string cp = decode_utf8(std::string_view(s).substr(i, std::min(len, s.size() - i)));
    if (cp.size() != 1 || !is_space(cp[0])) break;
    i += len;
  }
  return i - pos;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(normalize(std::move(source))) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      if (tag == std::string::npos) {
        emit_text(src_.substr(pos_), pos_);
        break;
      }
      const char kind = src_[tag + 1];
      char modifier = 0;
      if (tag + 2 < src_.size() && (src_[tag + 2] == '-' || src_[tag + 2] == '+')) modifier = src_[tag + 2];
      std::string text = src_.substr(pos_, tag - pos_);
      apply_left_whitespace_control(text, modifier, /*may_lstrip=*/kind != '{');
      emit_text(std::move(text), pos_);
      const size_t inner = tag + 2 + (modifier != 0 ? 1 : 0);
      if (kind == '#') {
        lex_comment(tag, inner);
      } else if (kind == '%' && lex_raw(tag, inner)) {
        // the raw block's text is emitted
      } else {
        lex_tag(tag, inner, kind == '%');
      }
    }
    tokens_.push_back(Token{Token::Type::End, "", location(src_.size())});
    return std::move(tokens_);
  }

 private:
  // jinja2 normalizes every line ending to "\n" and drops one trailing newline before lexing.
  static std::string normalize(std::string s) {
    std::string out;
    out.reserve(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (s[i] == '\r') {
        out.push_back('\n');
        if (i + 1 < s.size() && s[i + 1] == '\n') ++i;
      } else {
        out.push_back(s[i]);
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  Location location(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return Location{static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void fail(const std::string& message, size_t offset) const {
    const Location loc = location(offset);
    throw TemplateError(message, loc.line, loc.column);
  }

  size_t find_tag(size_t from) const {
    size_t i = src_.find('{', from);
    while (i != std::string::npos && i + 1 < src_.size()) {
      const char next = src_[i + 1];
      if (next == '{' || next == '%' || next == '#') return i;
      i = src_.find('{', i + 1);
    }
    return std::string::npos;
  }

  void emit_text(std::string text, size_t offset) {
    if (!text.empty()) tokens_.push_back(Token{Token::Type::Text, std::move(text), location(offset)});
  }

  // The text before a tag: `-` strips all whitespace before it; otherwise lstrip_blocks removes the
  // spaces and tabs between the start of the line and a block or comment tag (not a `{{`), unless `+`.
  void apply_left_whitespace_control(std::string& text, char modifier, bool may_lstrip) const {
    if (modifier == '-') {
      text = strip(text, nullptr, false, true);
    } else if (modifier != '+' && may_lstrip) {
      const size_t nl = text.rfind('\n');
      const size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
      if (line_begin > 0 || line_starting_) {
        const size_t ws = whitespace_run(text, line_begin);
        if (ws > 0 && line_begin + ws == text.size()) text.resize(line_begin);
      }
    }
  }

  // After a tag's end delimiter at [end, end+len): `-` eats all following whitespace, trim_blocks one
  // newline after a block or comment, `+` nothing. Sets pos_ and remembers whether a line starts next.
  void finish_tag(size_t after, char modifier, bool trim_newline) {
    if (modifier == '-') {
      after += whitespace_run(src_, after);
    } else if (modifier != '+' && trim_newline && after < src_.size() && src_[after] == '\n') {
      ++after;
    }
    line_starting_ = after > 0 && src_[after - 1] == '\n';
    pos_ = after;
  }

  void lex_comment(size_t tag, size_t inner) {
    if (inner >= src_.size()) {  // jinja2 ignores a `{#` that ends the template (its lexer stops there)
      pos_ = src_.size();
      return;
    }
    const size_t end = src_.find("#}", inner);
    if (end == std::string::npos) fail("unterminated comment (missing '#}')", tag);
    char modifier = 0;
    if (end > inner && (src_[end - 1] == '-' || src_[end - 1] == '+')) modifier = src_[end - 1];
    finish_tag(end + 2, modifier, true);
  }

  // `{% raw %}...{% endraw %}`: the text between is emitted verbatim. Returns false if the tag is not raw.
  bool lex_raw(size_t tag, size_t inner) {
    size_t i = inner + whitespace_run(src_, inner);
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && is_name_char(src_[i + 3]))) return false;
    i += 3;
    i += whitespace_run(src_, i);
    if (src_.compare(i, 3, "-%}") == 0) {
      i += 3;
      i += whitespace_run(src_, i);
    } else if (src_.compare(i, 2, "%}") == 0) {
      i += 2;
    } else {
      return false;
    }
    // Find `{%[-+]? endraw [-+]?%}`.
    size_t search = i;
    while (true) {
      const size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail("missing end of raw block ({% endraw %})", tag);
      size_t j = open + 2;
      char modifier = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) modifier = src_[j++];
      j += whitespace_run(src_, j);
      if (src_.compare(j, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      j += 6;
      j += whitespace_run(src_, j);
      char end_modifier = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_modifier = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      line_starting_ = i > 0 && src_[i - 1] == '\n';
      std::string text = src_.substr(i, open - i);
      apply_left_whitespace_control(text, modifier, true);
      emit_text(std::move(text), i);
      finish_tag(j + 2, end_modifier, true);
      return true;
    }
  }

  void lex_tag(size_t tag, size_t inner, bool is_block) {
    tokens_.push_back(Token{is_block ? Token::Type::BlockBegin : Token::Type::VariableBegin, "", location(tag)});
    std::vector<char> brackets;  // open ( [ {: a `}}` or `%}` inside them does not end the tag
    size_t i = inner;
    while (true) {
      i += whitespace_run(src_, i);
      if (i >= src_.size()) fail(is_block ? "unexpected end of template, expected '%}'" : "unexpected end of template, expected '}}'", tag);
      if (brackets.empty()) {
        const char* close = is_block ? "%}" : "}}";
        for (char modifier : {'-', '+', '\0'}) {
          const bool with_modifier = modifier != '\0';
          if (with_modifier && (src_[i] != modifier || (modifier == '+' && !is_block))) continue;
          const size_t at = i + (with_modifier ? 1 : 0);
          if (src_.compare(at, 2, close) == 0) {
            tokens_.push_back(
                Token{is_block ? Token::Type::BlockEnd : Token::Type::VariableEnd, "", location(i)});
            finish_tag(at + 2, modifier, is_block);
            return;
          }
        }
      }
      i = lex_token(i, brackets);
    }
  }

  size_t lex_token(size_t i, std::vector<char>& brackets) {
    const char c = src_[i];
    const Location loc = location(i);
    if (is_name_start(c)) {
      size_t j = i;
      while (j < src_.size() && is_name_char(src_[j])) ++j;
      tokens_.push_back(Token{Token::Type::Name, src_.substr(i, j - i), loc});
      return j;
    }
    if (is_digit(c)) return lex_number(i);
    if (c == '\'' || c == '"') return lex_string(i);
    static const char* const kTwoCharOperators[] = {"//", "**", "==", "!=", ">=", "<="};
    for (const char* op : kTwoCharOperators) {
      if (src_.compare(i, 2, op) == 0) {
        tokens_.push_back(Token{Token::Type::Operator, op, loc});
        return i + 2;
      }
    }
    static const std::string kOneCharOperators = "+-/*%~[](){}<>=.:|,;";
    if (kOneCharOperators.find(c) == std::string::npos) fail(std::string("unexpected character '") + c + "'", i);
    if (c == '(' || c == '[' || c == '{') {
      brackets.push_back(c);
    } else if (c == ')' || c == ']' || c == '}') {
      const char open = c == ')' ? '(' : c == ']' ? '[' : '{';
      if (brackets.empty() || brackets.back() != open) fail(std::string("unexpected '") + c + "'", i);
      brackets.pop_back();
    }
    tokens_.push_back(Token{Token::Type::Operator, std::string(1, c), loc});
    return i + 1;
  }

  // Digits with optional '_' separators; a float needs a fraction or an exponent. As in jinja2, no float
  // right after a '.', so `a.0.1` is two integer subscripts.
  size_t lex_number(size_t i) {
    const Location loc = location(i);
    auto digits = [&](size_t j, std::string& out) {
      while (j < src_.size() && (is_digit(src_[j]) || (src_[j] == '_' && j + 1 < src_.size() && is_digit(src_[j + 1])))) {
        if (src_[j] != '_') out.push_back(src_[j]);
        ++j;
      }
      return j;
    };
    std::string text;
    size_t j = digits(i, text);
    bool is_float = false;
    const bool after_dot = i > 0 && src_[i - 1] == '.';
    if (!after_dot && j + 1 < src_.size() && src_[j] == '.' && is_digit(src_[j + 1])) {
      text.push_back('.');
      j = digits(j + 1, text);
      is_float = true;
    }
    if (!after_dot && j < src_.size() && (src_[j] == 'e' || src_[j] == 'E')) {
      size_t k = j + 1;
      std::string exp = "e";
      if (k < src_.size() && (src_[k] == '+' || src_[k] == '-')) exp.push_back(src_[k++]);
      if (k < src_.size() && is_digit(src_[k])) {
        j = digits(k, exp);
        text += exp;
        is_float = true;
      }
    }
    tokens_.push_back(Token{is_float ? Token::Type::Float : Token::Type::Integer, text, loc});
    return j;
  }

  // A quoted string with Python's backslash escapes (jinja2 decodes them with 'unicode-escape').
  size_t lex_string(size_t i) {
    const char quote = src_[i];
    std::string out;
    size_t j = i + 1;
    while (true) {
      if (j >= src_.size()) fail("unterminated string", i);
      const char c = src_[j];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        ++j;
        continue;
      }
      if (j + 1 >= src_.size()) fail("unterminated string", i);
      const char e = src_[j + 1];
      j += 2;
      switch (e) {
        case '\n': break;  // a backslash-newline continues the line
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          if (j + n > src_.size()) fail("truncated \\" + std::string(1, e) + " escape in string", j - 2);
          char32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const char h = src_[j + k];
            int v = is_digit(h) ? h - '0' : (h >= 'a' && h <= 'f') ? h - 'a' + 10 : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
            if (v < 0) fail("truncated \\" + std::string(1, e) + " escape in string", j - 2);
            cp = cp * 16 + static_cast<char32_t>(v);
          }
          if (cp > 0x10FFFF) fail("illegal Unicode character in string escape", j - 2);
          out += encode_utf8(std::u32string_view(&cp, 1));
          j += n;
          break;
        }
        case 'N':
          fail("\\N{...} escapes in template strings are not supported", j - 2);
        default:
          if (e >= '0' && e <= '7') {
            char32_t cp = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && j < src_.size() && src_[j] >= '0' && src_[j] <= '7'; ++k, ++j)
              cp = cp * 8 + static_cast<char32_t>(src_[j] - '0');
            out += encode_utf8(std::u32string_view(&cp, 1));
          } else {
            out.push_back('\\');  // Python keeps unknown escapes as written
            out.push_back(e);
          }
      }
    }
    tokens_.push_back(Token{Token::Type::String, std::move(out), location(i)});
    return j + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;  // jinja2's lstrip_blocks also strips at the very start of the template
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(source).run(); }

}  // namespace hybridflow::text::jinja
