// jinja2's filters with transformers' override of tojson (json.dumps, without HTML escaping).
#include <algorithm>
#include <cmath>
#include <functional>
#include <map>

#include "text/jinja_builtins.h"
#include "text/jinja_call_args.h"
#include "text/jinja_json.h"
#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {
namespace {

using FilterFn = std::function<Value(const Value&, CallArgs&)>;

// The arguments after the first `skip` positional ones (select('equalto', x) passes x on to the test).
CallArgs rest_of(CallArgs& args, size_t skip) {
  CallArgs rest;
  for (size_t i = skip; i < args.positional.size(); ++i) rest.positional.push_back(args.positional[i]);
  rest.keyword = args.keyword;
  return rest;
}

// `a.b.0`-style attribute paths as jinja2's make_attrgetter resolves them (integers index lists).
Value get_path(const Value& obj, const std::string& path) {
  Value v = obj;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    v = numeric ? get_item(v, Value::integer(std::stoll(part))) : get_item(v, Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value attribute_of(const Value& item, const Value& attribute) {
  if (attribute.is_integral()) return get_item(item, attribute);
  if (!attribute.is_string()) throw EvalFailure("attribute must be a string or an integer");
  return get_path(item, attribute.as_string());
}

// For sort/unique/min/max: strings compare case-insensitively unless case_sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value::string(to_lower(v.as_string())) : v;
}

// jinja2's filters that run a str method on soft_str(value) return Markup for Markup input.
Value same_kind(const Value& input, std::string text) {
  return input.is_markup() ? Value::markup(std::move(text)) : Value::string(std::move(text));
}

std::vector<std::string> split_lines(const std::string& s) {
  CallArgs none;
  Value lines = get_attribute(Value::string(s), "splitlines").as_function().call(none);
  std::vector<std::string> out;
  for (const auto& l : lines.as_list().items) out.push_back(l.as_string());
  return out;
}

// jinja2's title filter: words start after whitespace, '-', or an opening bracket '(', '{', '[', '<'
// (unlike str.title, which starts a word after any uncased character).
std::string jinja_title(const std::string& s) {
  std::u32string cps = decode_utf8(s);
  auto is_separator = [](char32_t c) {
    return is_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
  };
  std::string out;
  size_t i = 0;
  while (i < cps.size()) {
    size_t j = i;
    const bool sep = is_separator(cps[i]);
    while (j < cps.size() && is_separator(cps[j]) == sep) ++j;
    const std::string piece = encode_utf8(std::u32string_view(cps).substr(i, j - i));
    if (sep) {
      out += piece;
    } else {
      out += to_upper(encode_utf8(std::u32string_view(cps).substr(i, 1)));
      out += to_lower(encode_utf8(std::u32string_view(cps).substr(i + 1, j - i - 1)));
    }
    i = j;
  }
  return out;
}

std::vector<Value> select_items(const Value& seq, CallArgs& args, bool by_attribute, bool keep_matches) {
  std::vector<Value> out;
  if (!truthy(seq)) return out;  // jinja2 checks `if seq` before iterating, so false / none select nothing
  const size_t test_at = by_attribute ? 1 : 0;
  Value attribute = by_attribute ? (args.positional.empty() ? throw EvalFailure("missing attribute") : args.positional[0])
                                 : Value();
  const bool has_test = args.positional.size() > test_at;
  std::string test_name;
  if (has_test) {
    if (!args.positional[test_at].is_string()) throw EvalFailure("the test name must be a string");
    test_name = args.positional[test_at].as_string();
    if (!is_known_test(test_name)) throw EvalFailure("unsupported test '" + test_name + "'");
  }
  CallArgs test_args = rest_of(args, test_at + 1);
  for (const Value& item : iterate(seq)) {
    const Value subject = by_attribute ? attribute_of(item, attribute) : item;
    CallArgs a = test_args;
    const bool passed = has_test ? apply_test(test_name, subject, a) : truthy(subject);
    if (passed == keep_matches) out.push_back(item);
  }
  return out;
}

Value filter_tojson(const Value& v, CallArgs& args) {
  BoundArgs a("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = a.flag(0, false);
  if (a.has(1) && !a.get(1).is_none()) {
    const Value& indent = a.get(1);
    if (indent.is_string()) o.indent = indent.as_string();
    else if (indent.is_integral()) o.indent = std::string(static_cast<size_t>(std::max<std::int64_t>(0, indent.as_int())), ' ');
    else throw EvalFailure("tojson indent must be an integer or a string");
  }
  if (a.has(2) && !a.get(2).is_none()) {
    const Value& seps = a.get(2);
    if (!seps.is_list() || seps.as_list().items.size() != 2 || !seps.as_list().items[0].is_string() ||
        !seps.as_list().items[1].is_string())
      throw EvalFailure("tojson separators must be a pair of strings");
    o.item_separator = seps.as_list().items[0].as_string();
    o.key_separator = seps.as_list().items[1].as_string();
  }
  o.sort_keys = a.flag(3, false);
  return Value::string(json_dumps(v, o));
}

Value filter_int(const Value& v, CallArgs& args) {
  BoundArgs a("int", args, {"default", "base"});
  const Value fallback = a.get_or(0, Value::integer(0));
  const std::int64_t base = a.has(1) ? a.integer(1) : 10;
  require_defined(v);  // int(Undefined) raises in jinja2
  if (v.is_integral()) return Value::integer(v.as_int());
  if (v.is_float()) {
    const double d = v.as_float();
    if (!std::isfinite(d)) return fallback;
    if (std::fabs(d) >= 9.2e18) throw EvalFailure("int: " + format_float(d) + " does not fit a 64-bit integer");
    return Value::integer(static_cast<std::int64_t>(d));
  }
  if (v.is_string()) {
    const std::string s = strip(v.as_string(), nullptr, true, true);
    std::string digits;
    for (char c : s)
      if (c != '_') digits.push_back(c);
    try {
      size_t used = 0;
      const std::int64_t i = std::stoll(digits, &used, static_cast<int>(base));
      if (used == digits.size()) return Value::integer(i);
    } catch (const std::exception&) {
    }
    // jinja2 then tries int(float(s)).
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) return Value::integer(static_cast<std::int64_t>(d));
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

Value filter_float(const Value& v, CallArgs& args) {
  BoundArgs a("float", args, {"default"});
  require_defined(v);
  if (v.is_numeric()) return Value::number(v.as_float());
  if (v.is_string()) {
    const std::string s = strip(v.as_string(), nullptr, true, true);
    try {
      size_t used = 0;
      const double d = std::stod(s, &used);
      if (used == s.size()) return Value::number(d);
    } catch (const std::exception&) {
    }
  }
  return a.get_or(0, Value::number(0.0));
}

Value filter_indent(const Value& v, CallArgs& args) {
  BoundArgs a("indent", args, {"width", "first", "blank"});
  std::string indentation = "    ";
  if (a.has(0)) {
    const Value& w = a.get(0);
    indentation = w.is_string() ? w.as_string() : std::string(static_cast<size_t>(std::max<std::int64_t>(0, a.integer(0))), ' ');
  }
  const bool first = a.flag(1, false), blank = a.flag(2, false);
  require_defined(v);
  if (!v.is_string()) throw EvalFailure("unsupported operand type(s) for +=: '" + type_name(v) + "' and 'str'");
  // As jinja2: a newline is appended first so splitlines() keeps a trailing empty line.
  std::vector<std::string> lines = split_lines(to_str(v) + "\n");
  std::string out;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) out += (i > 0 ? "\n" + indentation : "") + lines[i];
  } else {
    out = lines.empty() ? "" : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) out += "\n" + (lines[i].empty() ? "" : indentation + lines[i]);
  }
  if (first) out = indentation + out;
  return same_kind(v, std::move(out));
}

Value filter_sort(const Value& v, CallArgs& args) {
  BoundArgs a("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = a.flag(0, false), case_sensitive = a.flag(1, false);
  const Value attribute = a.get_or(2, Value::none());
  std::vector<Value> items = iterate(v);
  auto key = [&](const Value& item) {
    return sort_key(attribute.is_none() ? item : attribute_of(item, attribute), case_sensitive);
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? less_than(key(y), key(x)) : less_than(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value filter_min_max(const Value& v, CallArgs& args, bool want_max) {
  BoundArgs a(want_max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = a.flag(0, false);
  const Value attribute = a.get_or(1, Value::none());
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& item) {
    return sort_key(attribute.is_none() ? item : attribute_of(item, attribute), case_sensitive);
  };
  size_t best = 0;
  for (size_t i = 1; i < items.size(); ++i) {
    const bool better = want_max ? less_than(key(items[best]), key(items[i])) : less_than(key(items[i]), key(items[best]));
    if (better) best = i;
  }
  return items[best];
}

const std::map<std::string, FilterFn, std::less<>>& filters() {
  static const std::map<std::string, FilterFn, std::less<>> table = [] {
    std::map<std::string, FilterFn, std::less<>> t;
    t["abs"] = [](const Value& v, CallArgs& args) {
      BoundArgs("abs", args, {});
      if (v.is_float()) return Value::number(std::fabs(v.as_float()));
      if (v.is_integral()) return Value::integer(v.as_int() < 0 ? -v.as_int() : v.as_int());
      require_defined(v);
      throw EvalFailure("bad operand type for abs(): '" + type_name(v) + "'");
    };
    t["attr"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("attr", args, {"name"});
      return get_attribute(v, a.string(0));
    };
    t["capitalize"] = [](const Value& v, CallArgs& args) {
      BoundArgs("capitalize", args, {});
      return same_kind(v, capitalize(to_str(v)));
    };
    t["default"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("default", args, {"default_value", "boolean"});
      const bool use_default = v.is_undefined() || (a.flag(1, false) && !truthy(v));
      return use_default ? a.get_or(0, Value::string("")) : v;
    };
    t["d"] = t["default"];
    t["dictsort"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("dictsort", args, {"case_sensitive", "by", "reverse"});
      if (!v.is_dict()) throw EvalFailure("dictsort: can only sort a mapping");
      const bool case_sensitive = a.flag(0, false), reverse = a.flag(2, false);
      const std::string by = a.has(1) ? a.string(1) : "key";
      if (by != "key" && by != "value") throw EvalFailure("You can only sort by either 'key' or 'value'");
      std::vector<Value> pairs;
      for (const auto& [k, x] : v.as_dict().entries) pairs.push_back(Value::list({Value::string(k), x}, true));
      const size_t pos = by == "key" ? 0 : 1;
      std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
        const Value kx = sort_key(x.as_list().items[pos], case_sensitive), ky = sort_key(y.as_list().items[pos], case_sensitive);
        return reverse ? less_than(ky, kx) : less_than(kx, ky);
      });
      return Value::list(std::move(pairs));
    };
    t["escape"] = [](const Value& v, CallArgs& args) {
      BoundArgs("escape", args, {});
      return html_escape(v);
    };
    t["e"] = t["escape"];
    t["first"] = [](const Value& v, CallArgs& args) {
      BoundArgs("first", args, {});
      std::vector<Value> items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    t["last"] = [](const Value& v, CallArgs& args) {
      BoundArgs("last", args, {});
      std::vector<Value> items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    t["float"] = filter_float;
    t["format"] = [](const Value& v, CallArgs& args) {
      // jinja2: str(value) % (kwargs or args); both at once is an error.
      if (!args.positional.empty() && !args.keyword.empty())
        throw EvalFailure("can't handle positional and keyword arguments at the same time");
      // soft_str(value) keeps a Markup, whose % escapes the arguments.
      const Value format = v.is_markup() ? v : Value::string(to_str(v));
      if (!args.keyword.empty()) {
        Dict d;
        for (auto& [k, x] : args.keyword) d.set(k, x);
        return binary_op("%", format, Value::dict(std::move(d)));
      }
      return binary_op("%", format, Value::list(args.positional, true));
    };
    t["indent"] = filter_indent;
    t["int"] = filter_int;
    t["items"] = [](const Value& v, CallArgs& args) {
      BoundArgs("items", args, {});
      if (v.is_undefined()) return Value::list({});
      if (!v.is_dict()) throw EvalFailure("Can only get item pairs from a mapping.");
      std::vector<Value> pairs;
      for (const auto& [k, x] : v.as_dict().entries) pairs.push_back(Value::list({Value::string(k), x}, true));
      return Value::list(std::move(pairs));
    };
    t["join"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("join", args, {"d", "attribute"});
      const std::string sep = a.has(0) ? to_str(a.get(0)) : "";
      std::string out;
      bool first = true;
      for (const Value& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += to_str(a.has(1) && !a.get(1).is_none() ? attribute_of(item, a.get(1)) : item);
      }
      return Value::string(std::move(out));
    };
    t["length"] = [](const Value& v, CallArgs& args) {
      BoundArgs("length", args, {});
      return Value::integer(length(v));
    };
    t["count"] = t["length"];
    t["list"] = [](const Value& v, CallArgs& args) {
      BoundArgs("list", args, {});
      return Value::list(iterate(v));
    };
    t["lower"] = [](const Value& v, CallArgs& args) {
      BoundArgs("lower", args, {});
      return same_kind(v, to_lower(to_str(v)));
    };
    t["upper"] = [](const Value& v, CallArgs& args) {
      BoundArgs("upper", args, {});
      return same_kind(v, to_upper(to_str(v)));
    };
    t["map"] = [](const Value& v, CallArgs& args) {
      std::vector<Value> out;
      if (!truthy(v)) return Value::list({});  // as jinja2: `if value:` before iterating
      const Value* attribute = nullptr;
      const Value* fallback = nullptr;
      for (auto& [k, x] : args.keyword) {
        if (k == "attribute") attribute = &x;
        else if (k == "default") fallback = &x;
      }
      if (attribute != nullptr) {
        for (const Value& item : iterate(v)) {
          Value got = attribute_of(item, *attribute);
          out.push_back(got.is_undefined() && fallback != nullptr ? *fallback : got);
        }
        return Value::list(std::move(out));
      }
      if (args.positional.empty() || !args.positional[0].is_string()) throw EvalFailure("map: a filter name or attribute= is required");
      const std::string name = args.positional[0].as_string();
      if (!is_known_filter(name)) throw EvalFailure("unsupported filter '" + name + "'");
      CallArgs rest = rest_of(args, 1);
      for (const Value& item : iterate(v)) {
        CallArgs a = rest;
        out.push_back(apply_filter(name, item, a));
      }
      return Value::list(std::move(out));
    };
    t["max"] = [](const Value& v, CallArgs& args) { return filter_min_max(v, args, true); };
    t["min"] = [](const Value& v, CallArgs& args) { return filter_min_max(v, args, false); };
    t["reject"] = [](const Value& v, CallArgs& args) { return Value::list(select_items(v, args, false, false)); };
    t["rejectattr"] = [](const Value& v, CallArgs& args) { return Value::list(select_items(v, args, true, false)); };
    t["select"] = [](const Value& v, CallArgs& args) { return Value::list(select_items(v, args, false, true)); };
    t["selectattr"] = [](const Value& v, CallArgs& args) { return Value::list(select_items(v, args, true, true)); };
    t["replace"] = [](const Value& v, CallArgs& args) {
      CallArgs forwarded = args;  // str.replace(old, new, count) on str(v)
      return get_attribute(Value::string(to_str(v)), "replace").as_function().call(forwarded);
    };
    t["reverse"] = [](const Value& v, CallArgs& args) {
      BoundArgs("reverse", args, {});
      if (v.is_string()) {
        std::u32string cps = decode_utf8(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value::string(encode_utf8(cps));
      }
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    };
    t["round"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("round", args, {"precision", "method"});
      const std::int64_t precision = a.has(0) ? a.integer(0) : 0;
      const std::string method = a.has(1) ? a.string(1) : "common";
      if (!v.is_numeric()) throw EvalFailure("round: expected a number, got " + type_name(v));
      if (method == "common" && v.is_integral() && precision >= 0) return Value::integer(v.as_int());  // round(int) is an int
      const double scale = std::pow(10.0, static_cast<double>(precision));
      const double x = v.as_float() * scale;
      double r;
      if (method == "common") r = std::nearbyint(x);  // Python's round(): half to even
      else if (method == "floor") r = std::floor(x);
      else if (method == "ceil") r = std::ceil(x);
      else throw EvalFailure("method must be common, ceil or floor");
      return Value::number(r / scale);
    };
    t["safe"] = [](const Value& v, CallArgs& args) {
      BoundArgs("safe", args, {});
      return Value::markup(to_str(v));
    };
    t["sort"] = filter_sort;
    t["string"] = [](const Value& v, CallArgs& args) {
      BoundArgs("string", args, {});
      return same_kind(v, to_str(v));
    };
    t["sum"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("sum", args, {"attribute", "start"});
      Value total = a.get_or(1, Value::integer(0));
      for (const Value& item : iterate(v))
        total = binary_op("+", total, a.has(0) && !a.get(0).is_none() ? attribute_of(item, a.get(0)) : item);
      return total;
    };
    t["title"] = [](const Value& v, CallArgs& args) {
      BoundArgs("title", args, {});
      return Value::string(jinja_title(to_str(v)));
    };
    t["tojson"] = filter_tojson;
    t["trim"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("trim", args, {"chars"});
      const Value chars = a.get_or(0, Value::none());
      return same_kind(v, strip(to_str(v), chars.is_string() ? &chars.as_string() : nullptr, true, true));
    };
    t["unique"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("unique", args, {"case_sensitive", "attribute"});
      const bool case_sensitive = a.flag(0, false);
      const Value attribute = a.get_or(1, Value::none());
      std::vector<Value> out, seen;
      for (const Value& item : iterate(v)) {
        Value key = sort_key(attribute.is_none() ? item : attribute_of(item, attribute), case_sensitive);
        require_hashable(key);  // jinja2 keeps the seen keys in a set
        if (std::any_of(seen.begin(), seen.end(), [&](const Value& s) { return equals(s, key); })) continue;
        seen.push_back(std::move(key));
        out.push_back(item);
      }
      return Value::list(std::move(out));
    };
    t["wordcount"] = [](const Value& v, CallArgs& args) {
      BoundArgs("wordcount", args, {});
      std::int64_t n = 0;
      bool in_word = false;
      for (char32_t c : decode_utf8(to_str(v))) {
        if (c >= 0x80) throw EvalFailure("wordcount on non-ASCII text is not supported");
        const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
        if (word && !in_word) ++n;
        in_word = word;
      }
      return Value::integer(n);
    };
    return t;
  }();
  return table;
}

}  // namespace

bool is_known_filter(std::string_view name) { return filters().count(name) > 0; }

Value apply_filter(const std::string& name, const Value& input, CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) throw EvalFailure("unsupported filter '" + name + "'");
  return it->second(input, args);
}

}  // namespace hybridflow::text::jinja
