// The values a Jinja template computes with, with Python's semantics (jinja2 evaluates templates as
// Python objects, and chat templates are written against that): truthiness, str() and repr(), ==, <,
// iteration and len(). Data comes in as JSON; namespaces, callables and Undefined exist only here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace hybridflow::text::jinja {

// Thrown by value operations and builtins, which do not know where in the template they run; the
// evaluator turns it into a TemplateError at the position of the expression it was evaluating.
class EvalFailure : public std::runtime_error {
 public:
  explicit EvalFailure(const std::string& message) : std::runtime_error(message) {}
};

class Value;

// A Python list or tuple (tuples come from `a, b` expressions and dict.items(); they print differently).
struct List {
  std::vector<Value> items;
  bool is_tuple = false;
};

// A Python dict with string keys, in insertion order (templates rely on the order of tool schemas).
// Linear lookup: template dicts are small, and keeping one vector preserves order for free.
struct Dict {
  std::vector<std::pair<std::string, Value>> entries;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
};

// jinja2's namespace(): the one mutable object a template has (`{% set ns.x = ... %}`), shared by reference.
struct Namespace {
  Dict attributes;
};

// Arguments of a call: positional, then keyword in call order.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

// A global function, a macro, or a method bound to its object.
struct Function {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

// jinja2's default Undefined: a missing variable, key or attribute. It prints as '' and iterates as
// empty, but using it as a value (attribute access, arithmetic, tojson) fails with `hint`.
struct Undefined {
  std::string hint;  // e.g. "'foo' is undefined", or "'dict object' has no attribute 'bar'"
};

class Value {
 public:
  enum class Kind { Undefined, None, Bool, Int, Float, String, List, Dict, Namespace, Function };

  Value() : data_(Undefined{}) {}
  static Value undefined(std::string hint) { return Value(FromData{}, Undefined{std::move(hint)}); }
  static Value none() { return Value(FromData{}, nullptr); }
  static Value boolean(bool b) { return Value(FromData{}, b); }
  static Value integer(std::int64_t i) { return Value(FromData{}, i); }
  static Value number(double d) { return Value(FromData{}, d); }
  static Value string(std::string s) { return Value(FromData{}, std::move(s)); }
  // markupsafe's Markup: a string already HTML-safe (from `escape` or `safe`). It prints like any
  // string, but escaping leaves it alone and `+` / `%` escape the plain strings combined with it.
  static Value markup(std::string s) {
    Value v = string(std::move(s));
    v.markup_ = true;
    return v;
  }
  static Value list(std::vector<Value> items, bool is_tuple = false) {
    return Value(FromData{}, std::make_shared<const List>(List{std::move(items), is_tuple}));
  }
  static Value dict(Dict d) { return Value(FromData{}, std::make_shared<const Dict>(std::move(d))); }
  static Value new_namespace(Dict attributes) {
    return Value(FromData{}, std::make_shared<Namespace>(Namespace{std::move(attributes)}));
  }
  static Value function(std::string name, std::function<Value(CallArgs&)> call) {
    return Value(FromData{}, std::make_shared<const Function>(Function{std::move(name), std::move(call)}));
  }
  // JSON data as Python would see it after json.loads (objects keep their key order).
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return static_cast<Kind>(data_.index()); }
  bool is_undefined() const { return kind() == Kind::Undefined; }
  bool is_none() const { return kind() == Kind::None; }
  bool is_bool() const { return kind() == Kind::Bool; }
  bool is_int() const { return kind() == Kind::Int; }
  bool is_float() const { return kind() == Kind::Float; }
  bool is_string() const { return kind() == Kind::String; }
  bool is_markup() const { return markup_ && is_string(); }
  bool is_list() const { return kind() == Kind::List; }
  bool is_dict() const { return kind() == Kind::Dict; }
  bool is_namespace() const { return kind() == Kind::Namespace; }
  bool is_function() const { return kind() == Kind::Function; }
  // Python numbers: bool is an int subclass, so True + 1 == 2 and `true is number`.
  bool is_integral() const { return is_int() || is_bool(); }
  bool is_numeric() const { return is_integral() || is_float(); }

  bool as_bool() const { return std::get<bool>(data_); }
  std::int64_t as_int() const { return is_bool() ? (as_bool() ? 1 : 0) : std::get<std::int64_t>(data_); }
  double as_float() const { return is_float() ? std::get<double>(data_) : static_cast<double>(as_int()); }
  const std::string& as_string() const { return std::get<std::string>(data_); }
  const List& as_list() const { return *std::get<std::shared_ptr<const List>>(data_); }
  const Dict& as_dict() const { return *std::get<std::shared_ptr<const Dict>>(data_); }
  Namespace& as_namespace() const { return *std::get<std::shared_ptr<Namespace>>(data_); }
  const Function& as_function() const { return *std::get<std::shared_ptr<const Function>>(data_); }
  const std::string& undefined_hint() const { return std::get<Undefined>(data_).hint; }
  // Identity, for the `sameas` test and namespaces (Python `is`).
  const void* identity() const;

 private:
  using Data = std::variant<Undefined, std::nullptr_t, bool, std::int64_t, double, std::string,
                            std::shared_ptr<const List>, std::shared_ptr<const Dict>, std::shared_ptr<Namespace>,
                            std::shared_ptr<const Function>>;
  struct FromData {};  // a tag, so this constructor never competes with copying a Value
  template <typename T>
  Value(FromData, T&& v) : data_(std::forward<T>(v)) {}
  Data data_;
  bool markup_ = false;
};

// Python truthiness: empty containers, 0, '', None and Undefined are false.
bool truthy(const Value& v);
// Python str(v) as jinja2 prints `{{ v }}`: strings as-is, None as 'None', containers via repr.
std::string to_str(const Value& v);
// Python repr(v): 'quoted' strings, [a, b], {'k': v}, (a,), True, None, 1.0, Markup('...').
std::string repr(const Value& v);
// Python float repr (shortest round-trip digits): 1.0, 0.1, 1e+16, 1e-05, inf, nan.
std::string format_float(double d);
// Python ==: numbers compare by value across int/float/bool, containers element-wise; Undefined only
// equals Undefined.
bool equals(const Value& a, const Value& b);
// Python <: numbers, strings (code point order, which UTF-8 byte order preserves) and lists; other
// pairs raise TypeError in Python, an EvalFailure here.
bool less_than(const Value& a, const Value& b);
// The name Python gives the type in error messages: 'str', 'int', 'dict', 'NoneType', ...
std::string type_name(const Value& v);
// The elements `for x in v` visits: list items, dict keys, string characters (code points); Undefined
// iterates as empty, as jinja2's default Undefined does. Other values fail ("'int' object is not iterable").
std::vector<Value> iterate(const Value& v);
// Python len(v) (code points for strings; Undefined has length 0).
std::int64_t length(const Value& v);
// Fails with the undefined value's hint when `v` is Undefined: used where jinja2 raises UndefinedError.
void require_defined(const Value& v);

}  // namespace hybridflow::text::jinja
