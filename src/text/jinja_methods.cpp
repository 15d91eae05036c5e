// Attribute access (`obj.name`) and the methods of str, dict, list and Markup objects that templates
// call (`message.content.startswith('<tool_response>')`, `tool.get('function')`).
#include <algorithm>

#include "text/jinja_builtins.h"
#include "text/jinja_call_args.h"
#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {

// jinja2 names an object in "has no attribute" messages like this.
std::string object_description(const Value& v) {
  if (v.is_none()) return "None";
  return type_name(v) + " object";
}

namespace {

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
      if (name == "format" || (name == "replace" && i == 1)) args.positional[i] = markup_operand(args.positional[i]);
    for (auto& kw : args.keyword) kw.second = markup_operand(kw.second);
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

}  // namespace

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


}  // namespace hybridflow::text::jinja
