// jinja2's tests (`x is string`, `x is divisibleby 3`), with Python's semantics for each.
#include <functional>
#include <map>

#include "text/jinja_builtins.h"
#include "text/jinja_call_args.h"

namespace hybridflow::text::jinja {
namespace {

using TestFn = std::function<bool(const Value&, CallArgs&)>;

bool compare_test(const char* name, const Value& v, CallArgs& args, const std::function<bool(const Value&, const Value&)>& op) {
  BoundArgs a(name, args, {"other"});
  return op(v, a.get(0));
}

const std::map<std::string, TestFn, std::less<>>& tests() {
  static const std::map<std::string, TestFn, std::less<>> table = [] {
    std::map<std::string, TestFn, std::less<>> t;
    auto no_args = [](const char* name, std::function<bool(const Value&)> f) {
      return [name, f](const Value& v, CallArgs& args) {
        BoundArgs(name, args, {});
        return f(v);
      };
    };
    t["defined"] = no_args("defined", [](const Value& v) { return !v.is_undefined(); });
    t["undefined"] = no_args("undefined", [](const Value& v) { return v.is_undefined(); });
    t["none"] = no_args("none", [](const Value& v) { return v.is_none(); });
    t["boolean"] = no_args("boolean", [](const Value& v) { return v.is_bool(); });
    t["true"] = no_args("true", [](const Value& v) { return v.is_bool() && v.as_bool(); });
    t["false"] = no_args("false", [](const Value& v) { return v.is_bool() && !v.as_bool(); });
    t["string"] = no_args("string", [](const Value& v) { return v.is_string(); });
    t["number"] = no_args("number", [](const Value& v) { return v.is_numeric(); });
    t["integer"] = no_args("integer", [](const Value& v) { return v.is_int(); });
    t["float"] = no_args("float", [](const Value& v) { return v.is_float(); });
    t["mapping"] = no_args("mapping", [](const Value& v) { return v.is_dict(); });
    // Undefined is iterable (as empty) and has len() and [] in jinja2, so it passes both.
    t["iterable"] = no_args("iterable", [](const Value& v) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); });
    t["sequence"] = no_args("sequence", [](const Value& v) { return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict(); });
    // jinja2's Undefined defines __call__ (calling it raises), so Python's callable() says yes.
    t["callable"] = no_args("callable", [](const Value& v) { return v.is_function() || v.is_undefined(); });
    t["escaped"] = no_args("escaped", [](const Value& v) { return v.is_markup(); });
    t["lower"] = no_args("lower", [](const Value& v) {
      CallArgs none;
      return truthy(get_attribute(Value::string(to_str(v)), "islower").as_function().call(none));
    });
    t["upper"] = no_args("upper", [](const Value& v) {
      CallArgs none;
      return truthy(get_attribute(Value::string(to_str(v)), "isupper").as_function().call(none));
    });
    // Python's `value % 2` and `value % num`, so floats work too (1e20 is even).
    t["odd"] = no_args("odd", [](const Value& v) { return equals(binary_op("%", v, Value::integer(2)), Value::integer(1)); });
    t["even"] = no_args("even", [](const Value& v) { return equals(binary_op("%", v, Value::integer(2)), Value::integer(0)); });
    t["divisibleby"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("divisibleby", args, {"num"});
      return equals(binary_op("%", v, a.get(0)), Value::integer(0));
    };
    t["eq"] = [](const Value& v, CallArgs& args) { return compare_test("eq", v, args, equals); };
    t["ne"] = [](const Value& v, CallArgs& args) {
      return compare_test("ne", v, args, [](const Value& a, const Value& b) { return !equals(a, b); });
    };
    t["lt"] = [](const Value& v, CallArgs& args) { return compare_test("lt", v, args, less_than); };
    t["gt"] = [](const Value& v, CallArgs& args) {
      return compare_test("gt", v, args, [](const Value& a, const Value& b) { return less_than(b, a); });
    };
    t["le"] = [](const Value& v, CallArgs& args) {
      return compare_test("le", v, args, [](const Value& a, const Value& b) { return less_than(a, b) || equals(a, b); });
    };
    t["ge"] = [](const Value& v, CallArgs& args) {
      return compare_test("ge", v, args, [](const Value& a, const Value& b) { return less_than(b, a) || equals(a, b); });
    };
    t["=="] = t["equalto"] = t["eq"];
    t["!="] = t["ne"];
    t["<"] = t["lessthan"] = t["lt"];
    t[">"] = t["greaterthan"] = t["gt"];
    t["<="] = t["le"];
    t[">="] = t["ge"];
    t["in"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("in", args, {"seq"});
      return contains(a.get(0), v);
    };
    t["sameas"] = [](const Value& v, CallArgs& args) {
      BoundArgs a("sameas", args, {"other"});
      const Value& o = a.get(0);
      if (v.kind() != o.kind()) return false;
      if (v.is_none() || v.is_undefined()) return v.is_none();
      if (v.is_bool()) return v.as_bool() == o.as_bool();
      return v.identity() != nullptr && v.identity() == o.identity();
    };
    t["filter"] = [](const Value& v, CallArgs& args) {
      BoundArgs("filter", args, {});
      return v.is_string() && is_known_filter(v.as_string());
    };
    t["test"] = [](const Value& v, CallArgs& args) {
      BoundArgs("test", args, {});
      return v.is_string() && is_known_test(v.as_string());
    };
    return t;
  }();
  return table;
}

}  // namespace

bool is_known_test(std::string_view name) { return tests().count(name) > 0; }

bool apply_test(const std::string& name, const Value& input, CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) throw EvalFailure("unsupported test '" + name + "'");
  return it->second(input, args);
}

}  // namespace hybridflow::text::jinja
