// markupsafe's Markup as templates meet it: escape(), and what Markup's operators do to the plain
// values combined with it.
#include "text/jinja_builtins.h"

namespace hybridflow::text::jinja {
namespace {

std::string escape_html_text(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out.push_back(c);
    }
  }
  return out;
}

}  // namespace

Value html_escape(const Value& v) { return v.is_markup() ? v : Value::markup(escape_html_text(to_str(v))); }

// What Markup's operators do to a plain operand: escape its str() (markupsafe's _MarkupEscapeHelper).
Value markup_operand(const Value& v) {
  if (v.is_markup() || v.is_numeric()) return v;  // %d / %f still see numbers
  return Value::markup(escape_html_text(to_str(v)));
}

}  // namespace hybridflow::text::jinja
