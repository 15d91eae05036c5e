#include "text/jinja_value.h"

#include <charconv>
#include <cmath>
#include <limits>

#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {

const Value* Dict::find(std::string_view key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

Value* Dict::find(std::string_view key) {
  for (auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void Dict::set(std::string key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);  // Python keeps a re-assigned key at its first position
  } else {
    entries.emplace_back(std::move(key), std::move(value));
  }
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::null:
      return none();
    case Type::boolean:
      return boolean(json.get<bool>());
    case Type::number_integer:
      return integer(json.get<std::int64_t>());
    case Type::number_unsigned: {
      const auto u = json.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
        throw EvalFailure("integer " + std::to_string(u) + " in the template's input is too large (64-bit signed only)");
      return integer(static_cast<std::int64_t>(u));
    }
    case Type::number_float:
      return number(json.get<double>());
    case Type::string:
      return string(json.get<std::string>());
    case Type::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case Type::object: {
      Dict d;
      d.entries.reserve(json.size());
      for (const auto& [k, v] : json.items()) d.entries.emplace_back(k, from_json(v));
      return dict(std::move(d));
    }
    default:
      throw EvalFailure("the template's input holds a JSON value of an unsupported type (binary)");
  }
}

const void* Value::identity() const {
  switch (kind()) {
    case Kind::List:
      return &as_list();
    case Kind::Dict:
      return &as_dict();
    case Kind::Namespace:
      return &as_namespace();
    case Kind::Function:
      return &as_function();
    default:
      return nullptr;
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return false;
    case Value::Kind::Bool:
      return v.as_bool();
    case Value::Kind::Int:
      return v.as_int() != 0;
    case Value::Kind::Float:
      return v.as_float() != 0.0;
    case Value::Kind::String:
      return !v.as_string().empty();
    case Value::Kind::List:
      return !v.as_list().items.empty();
    case Value::Kind::Dict:
      return !v.as_dict().entries.empty();
    default:
      return true;
  }
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  // Shortest round-trip digits in scientific form, then laid out by Python's repr rule: positional
  // notation for exponents in [-5, 16), scientific (with a two-digit minimum exponent) otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string sign;
  if (!sci.empty() && sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits.push_back(c);
  if (exponent >= -4 && exponent < 16) {
    std::string out;
    if (exponent >= 0) {
      if (digits.size() <= static_cast<size_t>(exponent) + 1) {
        out = digits + std::string(exponent + 1 - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
      }
    } else {
      out = "0." + std::string(-exponent - 1, '0') + digits;
    }
    return sign + out;
  }
  std::string out = digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  const int abs_exp = exponent < 0 ? -exponent : exponent;
  out += exponent < 0 ? "e-" : "e+";
  if (abs_exp < 10) out += "0";
  out += std::to_string(abs_exp);
  return sign + out;
}

namespace {

// Code points Python's str.isprintable() rejects among those chat text may contain (controls,
// separators other than the space, and format characters): repr() escapes them.
bool is_unprintable(char32_t c) {
  return c < 0x20 || (c >= 0x7F && c <= 0xA0) || c == 0xAD || c == 0x1680 || (c >= 0x2000 && c <= 0x200F) ||
         (c >= 0x2028 && c <= 0x202F) || (c >= 0x205F && c <= 0x2064) || c == 0x3000 || c == 0xFEFF ||
         (c >= 0xD800 && c <= 0xDFFF);
}

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : decode_utf8(s)) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == static_cast<char32_t>(quote)) {
      out += '\\';
      out += quote;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (is_unprintable(c)) {
      char buf[16];
      if (c <= 0xFF) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += encode_utf8(std::u32string_view(&c, 1));
    }
  }
  out += quote;
  return out;
}

std::string repr_dict(const Dict& d) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.entries) {
    if (!first) out += ", ";
    first = false;
    out += repr_string(k) + ": " + repr(v);
  }
  return out + "}";
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::String:
      return v.is_markup() ? "Markup(" + repr_string(v.as_string()) + ")" : repr_string(v.as_string());
    case Value::Kind::List: {
      const List& l = v.as_list();
      std::string out = l.is_tuple ? "(" : "[";
      for (size_t i = 0; i < l.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += repr(l.items[i]);
      }
      if (l.is_tuple && l.items.size() == 1) out += ",";
      return out + (l.is_tuple ? ")" : "]");
    }
    case Value::Kind::Dict:
      return repr_dict(v.as_dict());
    case Value::Kind::Undefined:
      return "Undefined";  // jinja2's Undefined repr, seen when a list holding one is printed
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "";
    case Value::Kind::None:
      return "None";
    case Value::Kind::Bool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::Int:
      return std::to_string(v.as_int());
    case Value::Kind::Float:
      return format_float(v.as_float());
    case Value::Kind::String:
      return v.as_string();
    case Value::Kind::List:
    case Value::Kind::Dict:
      return repr(v);
    case Value::Kind::Namespace:
      return "<Namespace " + repr_dict(v.as_namespace().attributes) + ">";
    case Value::Kind::Function:
      return "<function " + v.as_function().name + ">";
  }
  return "";
}

bool equals(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::Undefined:
    case Value::Kind::None:
      return true;
    case Value::Kind::String:
      return a.as_string() == b.as_string();
    case Value::Kind::List: {
      const List &x = a.as_list(), &y = b.as_list();
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i)
        if (!equals(x.items[i], y.items[i])) return false;
      return true;
    }
    case Value::Kind::Dict: {
      const Dict &x = a.as_dict(), &y = b.as_dict();
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (other == nullptr || !equals(v, *other)) return false;
      }
      return true;
    }
    default:
      return a.identity() == b.identity();
  }
}

bool less_than(const Value& a, const Value& b) {
  if (a.is_numeric() && b.is_numeric()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list() && a.as_list().is_tuple == b.as_list().is_tuple) {
    const auto &x = a.as_list().items, &y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equals(x[i], y[i])) return less_than(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  require_defined(a);
  require_defined(b);
  throw EvalFailure("'<' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return "Undefined";
    case Value::Kind::None:
      return "NoneType";
    case Value::Kind::Bool:
      return "bool";
    case Value::Kind::Int:
      return "int";
    case Value::Kind::Float:
      return "float";
    case Value::Kind::String:
      return "str";
    case Value::Kind::List:
      return v.as_list().is_tuple ? "tuple" : "list";
    case Value::Kind::Dict:
      return "dict";
    case Value::Kind::Namespace:
      return "Namespace";
    case Value::Kind::Function:
      return "function";
  }
  return "object";
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return {};
    case Value::Kind::List:
      return v.as_list().items;
    case Value::Kind::Dict: {
      std::vector<Value> keys;
      keys.reserve(v.as_dict().entries.size());
      for (const auto& entry : v.as_dict().entries) keys.push_back(Value::string(entry.first));
      return keys;
    }
    case Value::Kind::String: {
      std::vector<Value> chars;
      for (char32_t c : decode_utf8(v.as_string())) chars.push_back(Value::string(encode_utf8(std::u32string_view(&c, 1))));
      return chars;
    }
    default:
      throw EvalFailure("'" + type_name(v) + "' object is not iterable");
  }
}

std::int64_t length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::Undefined:
      return 0;
    case Value::Kind::String:
      return count_code_points(v.as_string());
    case Value::Kind::List:
      return static_cast<std::int64_t>(v.as_list().items.size());
    case Value::Kind::Dict:
      return static_cast<std::int64_t>(v.as_dict().entries.size());
    default:
      throw EvalFailure("object of type '" + type_name(v) + "' has no len()");
  }
}

void require_defined(const Value& v) {
  if (v.is_undefined()) throw EvalFailure(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

}  // namespace hybridflow::text::jinja
