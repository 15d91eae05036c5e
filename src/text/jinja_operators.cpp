// Attribute and item access, slicing, operators, and the methods of str, dict and list objects that
// templates call (`message.content.startswith('<tool_response>')`, `tool.get('function')`).
#include <algorithm>
#include <cstdio>
#include <cmath>
#include <limits>

#include "text/jinja_builtins.h"
#include "text/jinja_call_args.h"
#include "text/jinja_unicode.h"

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

// What Markup's operators do to a plain operand: escape its str() (markupsafe's _MarkupEscapeHelper).
Value escaped_operand(const Value& v) {
  if (v.is_markup() || v.is_numeric()) return v;  // %d / %f still see numbers
  return Value::markup(escape_html_text(to_str(v)));
}

// jinja2 names an object in "has no attribute" messages like this.
std::string object_description(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

Value missing_attribute(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_description(obj) + "' has no attribute '" + name + "'");
}

// ---- str methods ----

// Python's str.split: with no separator, runs of whitespace separate and ends are dropped.
std::vector<Value> split_string(const std::string& s, const Value& sep, std::int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string cps = decode_utf8(s);
    std::vector<std::pair<size_t, size_t>> words;  // [begin, end) in code points
    size_t i = 0;
    while (i < cps.size()) {
      while (i < cps.size() && is_space(cps[i])) ++i;
      if (i == cps.size()) break;
      size_t j = i;
      while (j < cps.size() && !is_space(cps[j])) ++j;
      words.emplace_back(i, j);
      i = j;
    }
    const size_t limit = maxsplit < 0 ? words.size() : static_cast<size_t>(maxsplit) + 1;
    auto piece = [&](size_t b, size_t e) { return encode_utf8(std::u32string_view(cps).substr(b, e - b)); };
    if (words.size() <= limit) {
      for (auto& [b, e] : words) parts.push_back(piece(b, e));
    } else if (!from_right) {
      for (size_t k = 0; k + 1 < limit; ++k) parts.push_back(piece(words[k].first, words[k].second));
      // The last part runs to the end, trailing whitespace stripped.
      size_t end = cps.size();
      while (end > 0 && is_space(cps[end - 1])) --end;
      parts.push_back(piece(words[limit - 1].first, end));
    } else {
      const size_t first_kept = words.size() - (limit - 1);
      size_t begin = 0;
      while (begin < cps.size() && is_space(cps[begin])) ++begin;
      parts.push_back(piece(begin, words[first_kept - 1].second));
      for (size_t k = first_kept; k < words.size(); ++k) parts.push_back(piece(words[k].first, words[k].second));
    }
  } else {
    if (!sep.is_string()) throw EvalFailure("must be str or None, not " + type_name(sep));
    const std::string& d = sep.as_string();
    if (d.empty()) throw EvalFailure("empty separator");
    std::vector<std::string> all;
    size_t start = 0;
    while (true) {
      const size_t at = s.find(d, start);
      if (at == std::string::npos) break;
      all.push_back(s.substr(start, at - start));
      start = at + d.size();
    }
    all.push_back(s.substr(start));
    const size_t splits = all.size() - 1;
    if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= splits) {
      parts = std::move(all);
    } else if (!from_right) {
      const auto m = static_cast<size_t>(maxsplit);
      for (size_t k = 0; k < m; ++k) parts.push_back(all[k]);
      std::string rest = all[m];
      for (size_t k = m + 1; k < all.size(); ++k) rest += d + all[k];
      parts.push_back(rest);
    } else {
      const auto m = static_cast<size_t>(maxsplit);
      std::string rest = all[0];
      for (size_t k = 1; k < all.size() - m; ++k) rest += d + all[k];
      parts.push_back(rest);
      for (size_t k = all.size() - m; k < all.size(); ++k) parts.push_back(all[k]);
    }
  }
  std::vector<Value> out;
  for (auto& p : parts) out.push_back(Value::string(std::move(p)));
  return out;
}

std::string replace_string(const std::string& s, const std::string& old, const std::string& replacement,
                           std::int64_t count) {
  if (old.empty()) {  // Python inserts the replacement around every code point
    std::u32string cps = decode_utf8(s);
    std::string out;
    std::int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += replacement;
        ++done;
      }
      if (i < cps.size()) out += encode_utf8(std::u32string_view(&cps[i], 1));
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  std::int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old, start);
    if (at == std::string::npos) break;
    out.append(s, start, at - start);
    out += replacement;
    start = at + old.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

// str.format with automatic ({}) or numbered ({0}) or named ({name}) fields and {{ }} escapes;
// conversions and format specs are not supported and fail.
std::string format_string(const std::string& fmt, CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    const char c = fmt[i];
    if (c == '{' && i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      ++i;
    } else if (c == '}' && i + 1 < fmt.size() && fmt[i + 1] == '}') {
      out.push_back('}');
      ++i;
    } else if (c == '{') {
      const size_t close = fmt.find('}', i);
      if (close == std::string::npos) throw EvalFailure("Single '{' encountered in format string");
      const std::string field = fmt.substr(i + 1, close - i - 1);
      if (field.find_first_of("!:[.") != std::string::npos)
        throw EvalFailure("str.format field '{" + field + "}' uses a conversion or format spec, which is not supported");
      const Value* v = nullptr;
      if (field.empty() || std::all_of(field.begin(), field.end(), [](char d) { return d >= '0' && d <= '9'; })) {
        const size_t index = field.empty() ? auto_index++ : std::stoul(field);
        if (index >= args.positional.size()) throw EvalFailure("Replacement index " + std::to_string(index) + " out of range");
        v = &args.positional[index];
      } else {
        for (auto& [k, kv] : args.keyword)
          if (k == field) v = &kv;
        if (v == nullptr) throw EvalFailure("KeyError: '" + field + "'");
      }
      out += to_str(*v);
      i = close;
    } else if (c == '}') {
      throw EvalFailure("Single '}' encountered in format string");
    } else {
      out.push_back(c);
    }
  }
  return out;
}

std::int64_t code_point_index(const std::string& s, size_t byte_pos) {
  return count_code_points(std::string_view(s).substr(0, byte_pos));
}

bool starts_or_ends_with(const std::string& s, const Value& affix, bool at_start, const char* method) {
  auto test = [&](const Value& a) {
    if (!a.is_string())
      throw EvalFailure(std::string(method) + " first arg must be str or a tuple of str, not " + type_name(a));
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return at_start ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list() && affix.as_list().is_tuple) {
    for (const auto& a : affix.as_list().items)
      if (test(a)) return true;
    return false;
  }
  return test(affix);
}

Value call_str_method(const std::string& s, const std::string& name, CallArgs& args) {
  const std::string fn = "str." + name;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BoundArgs a(fn, args, {"chars"});
    const Value chars = a.get_or(0, Value::none());
    if (!chars.is_none() && !chars.is_string()) throw EvalFailure(fn + " arg must be None or str");
    return Value::string(strip(s, chars.is_none() ? nullptr : &chars.as_string(), name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    BoundArgs a(fn, args, {"prefix"});
    return Value::boolean(starts_or_ends_with(s, a.get(0), name == "startswith", name.c_str()));
  }
  if (name == "split" || name == "rsplit") {
    BoundArgs a(fn, args, {"sep", "maxsplit"});
    return Value::list(split_string(s, a.get_or(0, Value::none()), a.has(1) ? a.integer(1) : -1, name == "rsplit"));
  }
  if (name == "splitlines") {
    BoundArgs a(fn, args, {"keepends"});
    const bool keep = a.flag(0, false);
    std::u32string cps = decode_utf8(s);
    std::vector<Value> lines;
    size_t begin = 0;
    for (size_t i = 0; i < cps.size(); ++i) {
      const char32_t c = cps[i];
      const bool is_break = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                            c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
      if (!is_break) continue;
      size_t end = i;
      if (c == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') ++i;
      lines.push_back(Value::string(encode_utf8(std::u32string_view(cps).substr(begin, (keep ? i + 1 : end) - begin))));
      begin = i + 1;
    }
    if (begin < cps.size()) lines.push_back(Value::string(encode_utf8(std::u32string_view(cps).substr(begin))));
    return Value::list(std::move(lines));
  }
  if (name == "replace") {
    BoundArgs a(fn, args, {"old", "new", "count"});
    return Value::string(replace_string(s, a.string(0), a.string(1), a.has(2) ? a.integer(2) : -1));
  }
  if (name == "upper") return BoundArgs(fn, args, {}), Value::string(to_upper(s));
  if (name == "lower") return BoundArgs(fn, args, {}), Value::string(to_lower(s));
  if (name == "title") return BoundArgs(fn, args, {}), Value::string(title_case(s));
  if (name == "capitalize") return BoundArgs(fn, args, {}), Value::string(capitalize(s));
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    BoundArgs a(fn, args, {"sub"});
    const std::string& sub = a.string(0);
    const size_t at = name[0] == 'r' ? s.rfind(sub) : s.find(sub);
    if (at == std::string::npos) {
      if (name == "index" || name == "rindex") throw EvalFailure("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(code_point_index(s, at));
  }
  if (name == "count") {
    BoundArgs a(fn, args, {"sub"});
    const std::string& sub = a.string(0);
    if (sub.empty()) return Value::integer(count_code_points(s) + 1);
    std::int64_t n = 0;
    for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    BoundArgs a(fn, args, {"iterable"});
    std::string out;
    bool first = true;
    for (const Value& item : iterate(a.get(0))) {
      if (!item.is_string()) throw EvalFailure("sequence item: expected str instance, " + type_name(item) + " found");
      if (!first) out += s;
      first = false;
      out += item.as_string();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") return Value::string(format_string(s, args));
  if (name == "removeprefix" || name == "removesuffix") {
    BoundArgs a(fn, args, {"affix"});
    const std::string& x = a.string(0);
    if (name == "removeprefix") return Value::string(s.compare(0, x.size(), x) == 0 ? s.substr(x.size()) : s);
    const bool ends = x.size() <= s.size() && s.compare(s.size() - x.size(), x.size(), x) == 0;
    return Value::string(ends ? s.substr(0, s.size() - x.size()) : s);
  }
  if (name == "partition" || name == "rpartition") {
    BoundArgs a(fn, args, {"sep"});
    const std::string& sep = a.string(0);
    if (sep.empty()) throw EvalFailure("empty separator");
    const size_t at = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<Value> parts;
    if (at == std::string::npos) {
      parts = name == "partition"
                  ? std::vector<Value>{Value::string(s), Value::string(""), Value::string("")}
                  : std::vector<Value>{Value::string(""), Value::string(""), Value::string(s)};
    } else {
      parts = {Value::string(s.substr(0, at)), Value::string(sep), Value::string(s.substr(at + sep.size()))};
    }
    return Value::list(std::move(parts), true);
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isupper" ||
      name == "islower") {
    BoundArgs(fn, args, {});
    std::u32string cps = decode_utf8(s);
    if (cps.empty()) return Value::boolean(false);
    if (name == "isupper" || name == "islower") {
      // Python: every cased character has that case (title-case letters have neither), and one exists.
      bool any_cased = false;
      for (char32_t c : cps) {
        if (!is_cased(c)) continue;
        if (name == "isupper" ? !is_upper(c) : !is_lower(c)) return Value::boolean(false);
        any_cased = true;
      }
      return Value::boolean(any_cased);
    }
    for (char32_t c : cps) {
      if (c >= 0x80 && name != "isspace")
        throw EvalFailure(fn + "() on non-ASCII text is not supported");
      const bool digit = c >= '0' && c <= '9';
      const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
      const bool ok = name == "isdigit" ? digit : name == "isalpha" ? alpha : name == "isalnum" ? digit || alpha : is_space(c);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  throw EvalFailure("unsupported method str." + name + "()");
}

bool is_str_method(const std::string& name) {
  static const char* const kNames[] = {
      "capitalize", "casefold", "center", "count", "encode", "endswith", "expandtabs", "find", "format",
      "format_map", "index", "isalnum", "isalpha", "isascii", "isdecimal", "isdigit", "isidentifier", "islower",
      "isnumeric", "isprintable", "isspace", "istitle", "isupper", "join", "ljust", "lower", "lstrip", "maketrans",
      "partition", "removeprefix", "removesuffix", "replace", "rfind", "rindex", "rjust", "rpartition", "rsplit",
      "rstrip", "split", "splitlines", "startswith", "strip", "swapcase", "title", "translate", "upper", "zfill"};
  for (const char* n : kNames)
    if (name == n) return true;
  return false;
}

// ---- dict and list methods ----

Value call_dict_method(const Value& self, const std::string& name, CallArgs& args) {
  const Dict& d = self.as_dict();
  const std::string fn = "dict." + name;
  if (name == "get") {
    BoundArgs a(fn, args, {"key", "default"});
    const Value& key = a.get(0);
    const Value* found = key.is_string() ? d.find(key.as_string()) : nullptr;
    return found != nullptr ? *found : a.get_or(1, Value::none());
  }
  if (name == "items" || name == "keys" || name == "values") {
    BoundArgs(fn, args, {});
    std::vector<Value> out;
    for (const auto& [k, v] : d.entries) {
      if (name == "items") out.push_back(Value::list({Value::string(k), v}, true));
      else if (name == "keys") out.push_back(Value::string(k));
      else out.push_back(v);
    }
    return Value::list(std::move(out));
  }
  throw EvalFailure("unsupported method dict." + name + "() (templates cannot modify data)");
}

bool is_dict_method(const std::string& name) {
  for (const char* n : {"clear", "copy", "fromkeys", "get", "items", "keys", "pop", "popitem", "setdefault", "update",
                        "values"})
    if (name == n) return true;
  return false;
}

Value call_list_method(const Value& self, const std::string& name, CallArgs& args) {
  const auto& items = self.as_list().items;
  const std::string fn = type_name(self) + "." + name;
  if (name == "count" || name == "index") {
    BoundArgs a(fn, args, {"value"});
    std::int64_t n = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!equals(items[i], a.get(0))) continue;
      if (name == "index") return Value::integer(static_cast<std::int64_t>(i));
      ++n;
    }
    if (name == "index") throw EvalFailure(repr(a.get(0)) + " is not in list");
    return Value::integer(n);
  }
  throw EvalFailure("unsupported method " + fn + "() (templates cannot modify data)");
}

bool is_list_method(const std::string& name) {
  for (const char* n : {"append", "clear", "copy", "count", "extend", "index", "insert", "pop", "remove", "reverse", "sort"})
    if (name == n) return true;
  return false;
}

// Markup's methods return Markup, escaping string arguments that become part of the text.
Value call_markup_method(const Value& self, const std::string& name, CallArgs& args) {
  static const char* const kTextResults[] = {"strip", "lstrip", "rstrip", "upper", "lower", "title", "capitalize",
                                             "replace", "removeprefix", "removesuffix", "format", "join"};
  bool returns_text = false;
  for (const char* n : kTextResults) returns_text = returns_text || name == n;
  if (name == "replace" || name == "format" || name == "join") {
    // replace escapes only the replacement; format all arguments; join the items.
    for (size_t i = 0; i < args.positional.size(); ++i)
      if (name == "format" || (name == "replace" && i == 1)) args.positional[i] = escaped_operand(args.positional[i]);
    for (auto& kw : args.keyword) kw.second = escaped_operand(kw.second);
    if (name == "join" && !args.positional.empty()) {
      std::vector<Value> items;
      for (const Value& x : iterate(args.positional[0])) items.push_back(x.is_string() ? html_escape(x) : x);
      args.positional[0] = Value::list(std::move(items));
    }
  }
  Value result = call_str_method(self.as_string(), name, args);
  if (returns_text && result.is_string()) return Value::markup(result.as_string());
  if ((name == "split" || name == "rsplit" || name == "splitlines") && result.is_list()) {
    std::vector<Value> items;
    for (const auto& x : result.as_list().items) items.push_back(Value::markup(x.as_string()));
    return Value::list(std::move(items));
  }
  return result;
}

Value bind_method(const Value& self, const std::string& name) {
  return Value::function(type_name(self) + "." + name, [self, name](CallArgs& args) {
    if (self.is_markup()) return call_markup_method(self, name, args);
    if (self.is_string()) return call_str_method(self.as_string(), name, args);
    if (self.is_dict()) return call_dict_method(self, name, args);
    return call_list_method(self, name, args);
  });
}

std::int64_t checked(long double exact, std::int64_t result) {
  if (exact > static_cast<long double>(std::numeric_limits<std::int64_t>::max()) ||
      exact < static_cast<long double>(std::numeric_limits<std::int64_t>::min()))
    throw EvalFailure("integer overflow (hybridflow's templates use 64-bit integers)");
  return result;
}

[[noreturn]] void unsupported_operands(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  throw EvalFailure("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
}

Value repeat(const Value& seq, std::int64_t times) {
  if (seq.is_string()) {
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value::string(std::move(out));
  }
  std::vector<Value> out;
  for (std::int64_t i = 0; i < times; ++i)
    out.insert(out.end(), seq.as_list().items.begin(), seq.as_list().items.end());
  return Value::list(std::move(out), seq.as_list().is_tuple);
}

double python_float_mod(double a, double b) {
  double m = std::fmod(a, b);
  if (m == 0) return std::copysign(0.0, b);  // Python: the zero takes the divisor's sign
  if ((m < 0) != (b < 0)) m += b;
  return m;
}

}  // namespace

Value html_escape(const Value& v) { return v.is_markup() ? v : Value::markup(escape_html_text(to_str(v))); }

// Python's printf-style `fmt % args` (and jinja2's format filter): %[(name)][flags][width][.precision]type
// for types s r d i u f F e E g G x X o c and %%. `args` is a tuple (positional), a dict (for %(name)s),
// or one value.
std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const bool mapping = args.is_dict();
  if (args.is_list() && args.as_list().is_tuple) positional = args.as_list().items;
  else positional = {args};  // a dict is also the one value for a plain %s
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) throw EvalFailure("incomplete format");
    if (fmt[i] == '%') {
      out.push_back('%');
      continue;
    }
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) throw EvalFailure("format requires a mapping");
      arg = args.as_dict().find(fmt.substr(i + 1, close - i - 1));
      if (arg == nullptr) throw EvalFailure("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string("-+ 0#").find(fmt[i]) != std::string::npos) spec.push_back(fmt[i++]);
    while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') spec.push_back(fmt[i++]);
    if (i < fmt.size() && fmt[i] == '.') {
      spec.push_back(fmt[i++]);
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') spec.push_back(fmt[i++]);
    }
    if (i >= fmt.size()) throw EvalFailure("incomplete format");
    if (fmt[i] == '*') throw EvalFailure("'*' widths in % formatting are not supported");
    const char type = fmt[i];
    if (arg == nullptr) {
      if (next >= positional.size()) throw EvalFailure("not enough arguments for format string");
      arg = &positional[next++];
    }
    char buf[512];
    switch (type) {
      case 's':
      case 'r': {
        // Width and precision count code points in Python; padding by bytes would differ for non-ASCII.
        const std::string text = type == 's' ? to_str(*arg) : repr(*arg);
        if (spec != "%") {
          bool ascii = true;
          for (char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
          if (!ascii) throw EvalFailure("width or precision on non-ASCII %s arguments is not supported");
          std::snprintf(buf, sizeof buf, (spec + "s").c_str(), text.c_str());
          out += buf;
        } else {
          out += text;
        }
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o':
      case 'c': {
        if (!arg->is_numeric()) throw EvalFailure("%" + std::string(1, type) + " format: a real number is required, not " + type_name(*arg));
        const auto n = static_cast<long long>(arg->is_float() ? std::trunc(arg->as_float()) : arg->as_int());
        if (type == 'c') {
          const auto cp = static_cast<char32_t>(n);
          out += encode_utf8(std::u32string_view(&cp, 1));
          break;
        }
        const char conv = type == 'i' || type == 'u' ? 'd' : type;
        std::snprintf(buf, sizeof buf, (spec + "ll" + conv).c_str(), n);
        out += buf;
        break;
      }
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G': {
        if (!arg->is_numeric()) throw EvalFailure("must be real number, not " + type_name(*arg));
        std::snprintf(buf, sizeof buf, (spec + type).c_str(), arg->as_float());
        out += buf;
        break;
      }
      default:
        throw EvalFailure(std::string("unsupported format character '") + type + "'");
    }
  }
  // Python complains about unused arguments only for a tuple or a value without [] (a list or dict
  // argument counts as a mapping there, so `'x' % [1]` is fine).
  const bool tuple = args.is_list() && args.as_list().is_tuple;
  const bool subscriptable = (args.is_list() && !tuple) || args.is_dict();
  if (!subscriptable && next < positional.size()) throw EvalFailure("not all arguments converted during string formatting");
  return out;
}

Value get_attribute(const Value& obj, const std::string& name) {
  require_defined(obj);
  switch (obj.kind()) {
    case Value::Kind::Dict: {
      if (is_dict_method(name)) return bind_method(obj, name);
      const Value* v = obj.as_dict().find(name);
      return v != nullptr ? *v : missing_attribute(obj, name);
    }
    case Value::Kind::Namespace: {
      const Value* v = obj.as_namespace().attributes.find(name);
      return v != nullptr ? *v : missing_attribute(obj, name);
    }
    case Value::Kind::String:
      return is_str_method(name) ? bind_method(obj, name) : missing_attribute(obj, name);
    case Value::Kind::List:
      return is_list_method(name) ? bind_method(obj, name) : missing_attribute(obj, name);
    default:
      return missing_attribute(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  require_defined(obj);
  if (obj.is_dict() && key.is_string()) {
    const Value* v = obj.as_dict().find(key.as_string());
    if (v != nullptr) return *v;
  } else if (obj.is_namespace() && key.is_string()) {
    const Value* v = obj.as_namespace().attributes.find(key.as_string());
    if (v != nullptr) return *v;
  } else if ((obj.is_list() || obj.is_string()) && key.is_integral()) {
    std::int64_t i = key.as_int();
    if (obj.is_list()) {
      const auto n = static_cast<std::int64_t>(obj.as_list().items.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return obj.as_list().items[static_cast<size_t>(i)];
    } else {
      std::u32string cps = decode_utf8(obj.as_string());
      const auto n = static_cast<std::int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return Value::string(encode_utf8(std::u32string_view(&cps[static_cast<size_t>(i)], 1)));
    }
    return Value::undefined("'" + object_description(obj) + "' has no element " + std::to_string(key.as_int()));
  }
  // As jinja2: a failed subscript with a string key falls back to the attribute (so d['items'] is a method).
  if (key.is_string()) return get_attribute(obj, key.as_string());
  return Value::undefined("'" + object_description(obj) + "' has no element " + repr(key));
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  require_defined(obj);
  if (!obj.is_list() && !obj.is_string()) return Value::undefined("'" + object_description(obj) + "' is not subscriptable");
  auto index_of = [](const Value& v) -> std::optional<std::int64_t> {
    if (v.is_none()) return std::nullopt;
    if (!v.is_integral()) throw EvalFailure("slice indices must be integers or None");
    return v.as_int();
  };
  const std::optional<std::int64_t> step_v = index_of(step);
  const std::int64_t st = step_v.value_or(1);
  if (st == 0) throw EvalFailure("slice step cannot be zero");
  std::u32string cps;
  std::int64_t n;
  if (obj.is_string()) {
    cps = decode_utf8(obj.as_string());
    n = static_cast<std::int64_t>(cps.size());
  } else {
    n = static_cast<std::int64_t>(obj.as_list().items.size());
  }
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<std::int64_t> v, std::int64_t dflt) {
    if (!v) return dflt;
    std::int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = st < 0 ? -1 : 0;
    } else if (i >= n) {
      i = st < 0 ? n - 1 : n;
    }
    return i;
  };
  const std::int64_t b = adjust(index_of(start), st < 0 ? n - 1 : 0);
  const std::int64_t e = adjust(index_of(stop), st < 0 ? -1 : n);
  std::vector<std::int64_t> picks;
  if (st > 0)
    for (std::int64_t i = b; i < e; i += st) picks.push_back(i);
  else
    for (std::int64_t i = b; i > e; i += st) picks.push_back(i);
  if (obj.is_string()) {
    std::u32string out;
    for (auto i : picks) out.push_back(cps[static_cast<size_t>(i)]);
    return Value::string(encode_utf8(out));
  }
  std::vector<Value> out;
  for (auto i : picks) out.push_back(obj.as_list().items[static_cast<size_t>(i)]);
  return Value::list(std::move(out), obj.as_list().is_tuple);
}

Value binary_op(const std::string& op, const Value& a, const Value& b) {
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  const bool numbers = a.is_numeric() && b.is_numeric();
  const bool floats = numbers && (a.is_float() || b.is_float());
  if (op == "+") {
    if (floats) return Value::number(a.as_float() + b.as_float());
    if (numbers) return Value::integer(checked(static_cast<long double>(a.as_int()) + b.as_int(), a.as_int() + b.as_int()));
    if (a.is_string() && b.is_string()) {
      // Markup + str and str + Markup (Markup's __radd__ runs first) escape the plain side.
      if (a.is_markup() || b.is_markup())
        return Value::markup(html_escape(a).as_string() + html_escape(b).as_string());
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
      std::vector<Value> items = a.as_list().items;
      items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
      return Value::list(std::move(items), a.as_list().is_tuple);
    }
    unsupported_operands(op, a, b);
  }
  if (op == "-") {
    if (floats) return Value::number(a.as_float() - b.as_float());
    if (numbers) return Value::integer(checked(static_cast<long double>(a.as_int()) - b.as_int(), a.as_int() - b.as_int()));
    unsupported_operands(op, a, b);
  }
  if (op == "*") {
    if (floats) return Value::number(a.as_float() * b.as_float());
    if (numbers) return Value::integer(checked(static_cast<long double>(a.as_int()) * b.as_int(), a.as_int() * b.as_int()));
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.as_int());
    if (a.is_integral() && (b.is_string() || b.is_list())) return repeat(b, a.as_int());
    unsupported_operands(op, a, b);
  }
  if (!numbers && op != "%") unsupported_operands(op, a, b);
  if (op == "/") {
    if (b.as_float() == 0) throw EvalFailure("division by zero");
    return Value::number(a.as_float() / b.as_float());
  }
  if (op == "//") {
    if (b.as_float() == 0) throw EvalFailure(floats ? "float floor division by zero" : "integer division or modulo by zero");
    if (floats) {
      // CPython's float floor division: from fmod, so that 7 // 0.1 is 69.0 as in Python.
      const double x = a.as_float(), y = b.as_float();
      const double mod = std::fmod(x, y);
      double div = (x - mod) / y;
      if (mod != 0 && ((y < 0) != (mod < 0))) div -= 1.0;
      if (div == 0) return Value::number(std::copysign(0.0, x / y));
      double floored = std::floor(div);
      if (div - floored > 0.5) floored += 1.0;
      return Value::number(floored);
    }
    const std::int64_t x = a.as_int(), y = b.as_int();
    std::int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::integer(q);
  }
  if (op == "%" && a.is_markup()) {
    // Markup % args escapes the arguments (each element of a tuple, each value of a dict).
    Value args = b;
    if (b.is_list() && b.as_list().is_tuple) {
      std::vector<Value> items;
      for (const auto& x : b.as_list().items) items.push_back(escaped_operand(x));
      args = Value::list(std::move(items), true);
    } else if (b.is_dict()) {
      Dict d;
      for (const auto& [k, x] : b.as_dict().entries) d.set(k, escaped_operand(x));
      args = Value::dict(std::move(d));
    } else {
      args = escaped_operand(b);
    }
    return Value::markup(percent_format(a.as_string(), args));
  }
  if (op == "%" && a.is_string()) return Value::string(percent_format(a.as_string(), b));
  if (!numbers) unsupported_operands(op, a, b);
  if (op == "%") {
    if (b.as_float() == 0) throw EvalFailure(floats ? "float modulo" : "integer division or modulo by zero");
    if (floats) return Value::number(python_float_mod(a.as_float(), b.as_float()));
    const std::int64_t x = a.as_int(), y = b.as_int();
    std::int64_t m = x % y;
    if (m != 0 && ((m < 0) != (y < 0))) m += y;
    return Value::integer(m);
  }
  if (op == "**") {
    if (a.as_float() == 0 && b.as_float() < 0) throw EvalFailure("0.0 cannot be raised to a negative power");
    if (floats || b.as_int() < 0) return Value::number(std::pow(a.as_float(), b.as_float()));
    const long double exact = std::pow(static_cast<long double>(a.as_int()), static_cast<long double>(b.as_int()));
    std::int64_t r = 1;
    for (std::int64_t i = 0; i < b.as_int() && std::fabs(static_cast<double>(exact)) < 9.3e18; ++i) r *= a.as_int();
    return Value::integer(checked(exact, r));
  }
  throw EvalFailure("unknown operator " + op);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::Undefined:
      return false;
    case Value::Kind::String:
      if (!item.is_string()) {
        require_defined(item);
        throw EvalFailure("'in <string>' requires string as left operand, not " + type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::List:
      for (const auto& x : container.as_list().items)
        if (equals(x, item)) return true;
      return false;
    case Value::Kind::Dict:
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      throw EvalFailure("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace hybridflow::text::jinja
