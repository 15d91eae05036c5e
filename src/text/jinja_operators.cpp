// Item access, slicing, Python's operators (with Markup's escaping) and printf-style formatting.
#include <cmath>
#include <cstdio>
#include <limits>

#include "text/jinja_builtins.h"
#include "text/jinja_unicode.h"

namespace hybridflow::text::jinja {
namespace {

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
      for (const auto& x : b.as_list().items) items.push_back(markup_operand(x));
      args = Value::list(std::move(items), true);
    } else if (b.is_dict()) {
      Dict d;
      for (const auto& [k, x] : b.as_dict().entries) d.set(k, markup_operand(x));
      args = Value::dict(std::move(d));
    } else {
      args = markup_operand(b);
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
    if (floats || b.as_int() < 0) {
      if (a.as_float() < 0 && std::isfinite(b.as_float()) && b.as_float() != std::floor(b.as_float()))
        throw EvalFailure("a negative number to a fractional power is complex in Python; templates do not support complex numbers");
      const double r = std::pow(a.as_float(), b.as_float());
      // Python raises where C overflows to infinity (but not for * or +, which give inf).
      if (std::isinf(r) && std::isfinite(a.as_float()) && std::isfinite(b.as_float()))
        throw EvalFailure("OverflowError: (34, 'Numerical result out of range')");
      return Value::number(r);
    }
    const long double exact = std::pow(static_cast<long double>(a.as_int()), static_cast<long double>(b.as_int()));
    std::int64_t r = 1;
    for (std::int64_t i = 0; i < b.as_int() && std::fabs(static_cast<double>(exact)) < 9.3e18; ++i) r *= a.as_int();
    return Value::integer(checked(exact, r));
  }
  throw EvalFailure("unknown operator " + op);
}

void require_hashable(const Value& v) {
  if (v.is_list() && v.as_list().is_tuple) {
    for (const auto& x : v.as_list().items) require_hashable(x);
  } else if (v.is_list() || v.is_dict() || v.is_namespace()) {
    throw EvalFailure("unhashable type: '" + type_name(v) + "'");
  }
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
      require_hashable(item);
      return item.is_string() && container.as_dict().find(item.as_string()) != nullptr;
    default:
      throw EvalFailure("argument of type '" + type_name(container) + "' is not iterable");
  }
}

}  // namespace hybridflow::text::jinja
