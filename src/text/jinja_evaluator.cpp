#include "text/jinja_evaluator.h"

#include <memory>
#include <unordered_map>

#include "hybridflow/text/template_error.h"
#include "text/jinja_builtins.h"

namespace hybridflow::text::jinja {
namespace {

struct Scope;
using ScopePtr = std::shared_ptr<Scope>;

struct Scope {
  std::unordered_map<std::string, Value> vars;
  ScopePtr parent;

  const Value* lookup(const std::string& name) const {
    for (const Scope* s = this; s != nullptr; s = s->parent.get()) {
      auto it = s->vars.find(name);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
  static ScopePtr child_of(const ScopePtr& parent) {
    auto s = std::make_shared<Scope>();
    s->parent = parent;
    return s;
  }
  // A new scope whose locals assigned later start Undefined (see jinja_scoping.h).
  static ScopePtr frame(const ScopePtr& parent, const std::vector<std::string>& undefined_at_entry) {
    ScopePtr s = child_of(parent);
    for (const auto& name : undefined_at_entry) s->vars[name] = Value::undefined("'" + name + "' is undefined");
    return s;
  }
};

enum class Flow { Normal, Break, Continue };

[[noreturn]] void fail_at(const std::string& message, const Location& loc) {
  throw TemplateError(message, loc.line, loc.column);
}

class Renderer {
 public:
  Flow exec_body(const Body& body, const ScopePtr& scope, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, scope, out);
      if (flow != Flow::Normal) return flow;
    }
    return Flow::Normal;
  }

  Value eval(const Expr& e, const ScopePtr& scope) {
    try {
      return eval_unguarded(e, scope);
    } catch (const TemplateRaised& raised) {
      // raise_exception(msg): the template's own message, positioned at the call.
      fail_at(raised.what(), e.location);
    } catch (const EvalFailure& failure) {
      fail_at(failure.what(), e.location);
    }
  }

 private:
  Flow exec(const Stmt& s, const ScopePtr& scope, std::string& out) {
    try {
      return exec_unguarded(s, scope, out);
    } catch (const EvalFailure& failure) {
      fail_at(failure.what(), s.location);
    }
  }

  Flow exec_unguarded(const Stmt& s, const ScopePtr& scope, std::string& out) {
    switch (s.kind) {
      case Stmt::Kind::Text:
        out += s.text;
        return Flow::Normal;
      case Stmt::Kind::Print:
        out += to_str(eval(*s.expr, scope));
        return Flow::Normal;
      case Stmt::Kind::If:
        for (size_t i = 0; i < s.conditions.size(); ++i)
          if (truthy(eval(*s.conditions[i], scope))) return exec_body(s.branches[i], scope, out);
        if (s.branches.size() > s.conditions.size()) return exec_body(s.branches.back(), scope, out);
        return Flow::Normal;
      case Stmt::Kind::For:
        exec_for(s, scope, out);
        return Flow::Normal;
      case Stmt::Kind::Set:
        assign(s.target, eval(*s.expr, scope), scope);
        return Flow::Normal;
      case Stmt::Kind::SetBlock: {
        std::string captured;
        exec_body(s.body, Scope::frame(scope, s.undefined_at_entry), captured);
        Value v = Value::string(std::move(captured));
        if (s.expr) v = apply_filter_chain(*s.expr, v, scope);
        assign(s.target, v, scope);
        return Flow::Normal;
      }
      case Stmt::Kind::Macro:
        scope->vars[s.name] = make_macro(s.name, s, scope);
        return Flow::Normal;
      case Stmt::Kind::CallBlock: {
        const Expr& call = *s.expr;
        Value callee = eval(*call.operands[0], scope);
        CallArgs args = eval_arguments(call, scope);
        args.keyword.emplace_back("caller", make_macro("caller", s, scope));
        out += to_str(invoke(callee, args));
        return Flow::Normal;
      }
      case Stmt::Kind::FilterBlock: {
        std::string captured;
        exec_body(s.body, Scope::frame(scope, s.undefined_at_entry), captured);
        out += to_str(apply_filter_chain(*s.expr, Value::string(std::move(captured)), scope));
        return Flow::Normal;
      }
      case Stmt::Kind::With: {
        ScopePtr inner = Scope::frame(scope, s.undefined_at_entry);
        for (size_t i = 0; i < s.targets.size(); ++i) assign(s.targets[i], eval(*s.values[i], scope), inner);
        exec_body(s.body, inner, out);
        return Flow::Normal;
      }
      case Stmt::Kind::Break:
        return Flow::Break;
      case Stmt::Kind::Continue:
        return Flow::Continue;
      case Stmt::Kind::Generation:
        exec_body(s.body, Scope::frame(scope, s.undefined_at_entry), out);
        return Flow::Normal;
    }
    return Flow::Normal;
  }

  void exec_for(const Stmt& s, const ScopePtr& scope, std::string& out) {
    std::vector<Value> items = iterate(eval(*s.expr, scope));
    if (s.condition) {  // `for x in xs if cond`: filtered first, so loop.length counts what is kept
      std::vector<Value> kept;
      for (auto& item : items) {
        ScopePtr probe = Scope::frame(scope, s.undefined_at_entry);
        assign(s.target, item, probe);
        if (truthy(eval(*s.condition, probe))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    const auto n = static_cast<std::int64_t>(items.size());
    // As jinja2 compiles it, the else body runs unless some iteration ran to its end: iterations that
    // `continue` or `break` do not count.
    bool completed_an_iteration = false;
    for (std::int64_t i = 0; i < n; ++i) {
      ScopePtr iteration = Scope::frame(scope, s.undefined_at_entry);
      assign(s.target, items[i], iteration);
      iteration->vars["loop"] = loop_object(items, i);
      const Flow flow = exec_body(s.body, iteration, out);
      if (flow == Flow::Normal) completed_an_iteration = true;
      if (flow == Flow::Break) break;
    }
    if (!completed_an_iteration) exec_body(s.else_body, Scope::frame(scope, s.else_undefined_at_entry), out);
  }

  static Value loop_object(const std::vector<Value>& items, std::int64_t i) {
    const auto n = static_cast<std::int64_t>(items.size());
    Dict loop;
    loop.entries.reserve(12);
    loop.set("index", Value::integer(i + 1));
    loop.set("index0", Value::integer(i));
    loop.set("revindex", Value::integer(n - i));
    loop.set("revindex0", Value::integer(n - i - 1));
    loop.set("first", Value::boolean(i == 0));
    loop.set("last", Value::boolean(i == n - 1));
    loop.set("length", Value::integer(n));
    loop.set("depth", Value::integer(1));
    loop.set("depth0", Value::integer(0));
    loop.set("previtem", i > 0 ? items[i - 1] : Value::undefined("there is no previous item"));
    loop.set("nextitem", i + 1 < n ? items[i + 1] : Value::undefined("there is no next item"));
    loop.set("cycle", Value::function("loop.cycle", [i](CallArgs& args) {
      if (args.positional.empty()) throw EvalFailure("no items for cycling given");
      return args.positional[static_cast<size_t>(i) % args.positional.size()];
    }));
    return Value::dict(std::move(loop));
  }

  void assign(const Target& t, const Value& value, const ScopePtr& scope) {
    if (!t.attribute.empty()) {
      const Value* obj = scope->lookup(t.names[0]);
      if (obj == nullptr || !obj->is_namespace())
        throw EvalFailure("cannot assign attribute on non-namespace object '" + t.names[0] + "'");
      if (!t.attribute.empty() && t.attribute[0] == '_')
        throw EvalFailure("chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                          t.attribute + "'");
      obj->as_namespace().attributes.set(t.attribute, value);
      return;
    }
    if (!t.unpack) {
      scope->vars[t.names[0]] = value;
      return;
    }
    std::vector<Value> parts = iterate(value);
    if (parts.size() != t.names.size()) {
      throw EvalFailure(parts.size() > t.names.size()
                            ? "too many values to unpack (expected " + std::to_string(t.names.size()) + ")"
                            : "not enough values to unpack (expected " + std::to_string(t.names.size()) + ", got " +
                                  std::to_string(parts.size()) + ")");
    }
    for (size_t i = 0; i < parts.size(); ++i) scope->vars[t.names[i]] = parts[i];
  }

  // A macro (or a call block's caller) defined by `def`; it runs in a new scope under `closure`.
  Value make_macro(const std::string& name, const Stmt& def, const ScopePtr& closure) {
    const std::vector<MacroParam>& params = def.params;
    return Value::function(name, [this, name, &def, &params, closure](CallArgs& args) {
      // Python stops runaway recursion (a macro calling itself) with RecursionError; so do we, before the stack does.
      if (macro_depth_ >= kMaxMacroDepth)
        throw EvalFailure("maximum recursion depth exceeded in macro '" + name + "'");
      struct DepthGuard {
        int& depth;
        explicit DepthGuard(int& d) : depth(d) { ++depth; }
        ~DepthGuard() { --depth; }
      } guard(macro_depth_);
      ScopePtr frame = Scope::frame(closure, def.undefined_at_entry);
      if (args.positional.size() > params.size())
        throw EvalFailure("macro '" + name + "' takes not more than " + std::to_string(params.size()) + " argument(s)");
      std::vector<bool> bound(params.size(), false);
      for (size_t i = 0; i < args.positional.size(); ++i) {
        frame->vars[params[i].name] = args.positional[i];
        bound[i] = true;
      }
      for (auto& [key, v] : args.keyword) {
        size_t i = 0;
        while (i < params.size() && params[i].name != key) ++i;
        if (i == params.size()) {
          if (key == "caller") {
            frame->vars["caller"] = v;
            continue;
          }
          throw EvalFailure("macro '" + name + "' takes no keyword argument '" + key + "'");
        }
        if (bound[i]) throw EvalFailure("macro '" + name + "' got multiple values for argument '" + key + "'");
        frame->vars[key] = v;
        bound[i] = true;
      }
      for (size_t i = 0; i < params.size(); ++i) {
        if (bound[i]) continue;
        frame->vars[params[i].name] = params[i].default_value
                                          ? eval(*params[i].default_value, frame)
                                          : Value::undefined("parameter '" + params[i].name + "' was not provided");
      }
      std::string out;
      exec_body(def.body, frame, out);
      return Value::string(std::move(out));
    });
  }

  CallArgs eval_arguments(const Expr& e, const ScopePtr& scope) {
    CallArgs args;
    for (size_t i = 1; i < e.operands.size(); ++i) args.positional.push_back(eval(*e.operands[i], scope));
    for (const auto& [key, expr] : e.kwargs) args.keyword.emplace_back(key, eval(*expr, scope));
    return args;
  }

  Value invoke(const Value& callee, CallArgs& args) {
    require_defined(callee);
    if (!callee.is_function()) throw EvalFailure("'" + type_name(callee) + "' object is not callable");
    return callee.as_function().call(args);
  }

  // A filter chain from a filter or set block: the innermost filter (null input) gets `input`.
  Value apply_filter_chain(const Expr& e, const Value& input, const ScopePtr& scope) {
    Value in = e.operands[0] ? apply_filter_chain(*e.operands[0], input, scope) : input;
    CallArgs args = eval_arguments(e, scope);
    try {
      return apply_filter(e.name, in, args);
    } catch (const EvalFailure& failure) {
      fail_at(failure.what(), e.location);
    }
  }

  Value eval_unguarded(const Expr& e, const ScopePtr& scope) {
    switch (e.kind) {
      case Expr::Kind::Literal:
        return e.literal;
      case Expr::Kind::Name: {
        const Value* v = scope->lookup(e.name);
        return v != nullptr ? *v : Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::List:
      case Expr::Kind::Tuple: {
        std::vector<Value> items;
        items.reserve(e.operands.size());
        for (const auto& o : e.operands) items.push_back(eval(*o, scope));
        return Value::list(std::move(items), e.kind == Expr::Kind::Tuple);
      }
      case Expr::Kind::Dict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.operands.size(); i += 2) {
          Value key = eval(*e.operands[i], scope);
          if (!key.is_string()) throw EvalFailure("dict keys other than strings are not supported");
          d.set(key.as_string(), eval(*e.operands[i + 1], scope));
        }
        return Value::dict(std::move(d));
      }
      case Expr::Kind::GetAttr:
        return get_attribute(eval(*e.operands[0], scope), e.name);
      case Expr::Kind::GetItem:
        return get_item(eval(*e.operands[0], scope), eval(*e.operands[1], scope));
      case Expr::Kind::Slice: {
        Value obj = eval(*e.operands[0], scope);
        Value parts[3];
        for (int i = 0; i < 3; ++i) parts[i] = e.operands[i + 1] ? eval(*e.operands[i + 1], scope) : Value::none();
        return slice_value(obj, parts[0], parts[1], parts[2]);
      }
      case Expr::Kind::Call: {
        Value callee = eval(*e.operands[0], scope);
        CallArgs args = eval_arguments(e, scope);
        return invoke(callee, args);
      }
      case Expr::Kind::Filter: {
        Value input = eval(*e.operands[0], scope);
        CallArgs args = eval_arguments(e, scope);
        return apply_filter(e.name, input, args);
      }
      case Expr::Kind::Test: {
        Value input = eval(*e.operands[0], scope);
        CallArgs args = eval_arguments(e, scope);
        return Value::boolean(apply_test(e.name, input, args) != e.negated);
      }
      case Expr::Kind::Negate: {
        Value v = eval(*e.operands[0], scope);
        if (!v.is_numeric()) {
          require_defined(v);
          throw EvalFailure("bad operand type for unary " + e.name + ": '" + type_name(v) + "'");
        }
        if (e.name == "+") return v.is_bool() ? Value::integer(v.as_int()) : v;
        return v.is_float() ? Value::number(-v.as_float()) : Value::integer(-v.as_int());
      }
      case Expr::Kind::Not:
        return Value::boolean(!truthy(eval(*e.operands[0], scope)));
      case Expr::Kind::Binary:
        return binary_op(e.name, eval(*e.operands[0], scope), eval(*e.operands[1], scope));
      case Expr::Kind::And: {
        Value left = eval(*e.operands[0], scope);
        return truthy(left) ? eval(*e.operands[1], scope) : left;
      }
      case Expr::Kind::Or: {
        Value left = eval(*e.operands[0], scope);
        return truthy(left) ? left : eval(*e.operands[1], scope);
      }
      case Expr::Kind::Compare: {
        Value left = eval(*e.operands[0], scope);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.operands[i + 1], scope);
          if (!compare(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::Conditional:
        if (truthy(eval(*e.operands[1], scope))) return eval(*e.operands[0], scope);
        if (e.operands[2]) return eval(*e.operands[2], scope);
        return Value::undefined("the inline if-expression evaluated to false and no else section was defined");
    }
    return Value();
  }

  static constexpr int kMaxMacroDepth = 200;
  int macro_depth_ = 0;

  static bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return equals(a, b);
    if (op == "!=") return !equals(a, b);
    if (op == "<") return less_than(a, b);
    if (op == ">") return less_than(b, a);
    if (op == "<=") return less_than(a, b) || equals(a, b);
    if (op == ">=") return less_than(b, a) || equals(a, b);
    if (op == "in") return contains(b, a);
    return !contains(b, a);  // notin
  }
};

}  // namespace

std::string render_template(const Body& body, const std::vector<std::string>& undefined_at_entry,
                            const Dict& context) {
  auto globals = std::make_shared<Scope>();
  for (auto& [name, v] : global_functions().entries) globals->vars[name] = v;
  ScopePtr variables = Scope::child_of(globals);
  for (const auto& [name, v] : context.entries) variables->vars[name] = v;
  // The template's own scope sits under the render variables, so its assignments shadow them.
  ScopePtr root = Scope::frame(variables, undefined_at_entry);
  Renderer renderer;
  std::string out;
  renderer.exec_body(body, root, out);
  return out;
}

}  // namespace hybridflow::text::jinja
