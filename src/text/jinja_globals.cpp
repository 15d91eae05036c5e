// The global functions of transformers' chat template environment (and jinja2's defaults it keeps).
#include <ctime>

#include "text/jinja_builtins.h"
#include "text/jinja_call_args.h"

namespace hybridflow::text::jinja {
namespace {

// jinja2's sandbox refuses ranges longer than this.
constexpr std::int64_t kMaxRange = 100000;

Value range(CallArgs& args) {
  if (!args.keyword.empty()) throw EvalFailure("range() takes no keyword arguments");
  std::int64_t start = 0, stop = 0, step = 1;
  const auto& p = args.positional;
  for (const auto& v : p)
    if (!v.is_integral()) throw EvalFailure("'" + type_name(v) + "' object cannot be interpreted as an integer");
  if (p.size() == 1) {
    stop = p[0].as_int();
  } else if (p.size() == 2 || p.size() == 3) {
    start = p[0].as_int();
    stop = p[1].as_int();
    if (p.size() == 3) step = p[2].as_int();
  } else {
    throw EvalFailure("range expected 1 to 3 arguments, got " + std::to_string(p.size()));
  }
  if (step == 0) throw EvalFailure("range() arg 3 must not be zero");
  std::vector<Value> out;
  for (std::int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
    if (static_cast<std::int64_t>(out.size()) >= kMaxRange)
      throw EvalFailure("Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    out.push_back(Value::integer(i));
  }
  return Value::list(std::move(out));
}

// dict(mapping_or_pairs, **kwargs) and namespace(...) take the same arguments.
Dict dict_from_arguments(const char* fn, CallArgs& args) {
  Dict d;
  if (args.positional.size() > 1) throw EvalFailure(std::string(fn) + " expected at most 1 positional argument");
  if (!args.positional.empty()) {
    const Value& init = args.positional[0];
    if (init.is_dict()) {
      d = init.as_dict();
    } else if (init.is_namespace()) {
      d = init.as_namespace().attributes;
    } else {
      for (const Value& pair : iterate(init)) {
        std::vector<Value> kv = iterate(pair);
        if (kv.size() != 2 || !kv[0].is_string())
          throw EvalFailure(std::string(fn) + ": each element must be a (string key, value) pair");
        d.set(kv[0].as_string(), kv[1]);
      }
    }
  }
  for (auto& [k, v] : args.keyword) d.set(k, v);
  return d;
}

Value strftime_now(CallArgs& args) {
  BoundArgs a("strftime_now", args, {"format"});
  const std::string& format = a.string(0);
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  if (format.empty()) return Value::string("");
  std::string buf(256 + format.size() * 8, '\0');
  const size_t n = std::strftime(buf.data(), buf.size(), format.c_str(), &local);
  if (n == 0) throw EvalFailure("strftime_now: the formatted date is empty or too long for format '" + format + "'");
  buf.resize(n);
  return Value::string(buf);
}

}  // namespace

Dict global_functions() {
  Dict g;
  g.set("range", Value::function("range", range));
  g.set("dict", Value::function("dict", [](CallArgs& args) { return Value::dict(dict_from_arguments("dict", args)); }));
  g.set("namespace", Value::function("namespace", [](CallArgs& args) {
    Dict attributes = dict_from_arguments("namespace", args);
    for (const auto& [k, v] : attributes.entries)
      if (!k.empty() && k[0] == '_')
        throw EvalFailure("chat templates cannot store underscore-prefixed attributes on a namespace, but got '" + k + "'");
    return Value::new_namespace(std::move(attributes));
  }));
  g.set("raise_exception", Value::function("raise_exception", [](CallArgs& args) -> Value {
    BoundArgs a("raise_exception", args, {"message"});
    throw TemplateRaised(to_str(a.get(0)));
  }));
  g.set("strftime_now", Value::function("strftime_now", strftime_now));
  g.set("joiner", Value::function("joiner", [](CallArgs& args) {
    BoundArgs a("joiner", args, {"sep"});
    const std::string sep = a.has(0) ? to_str(a.get(0)) : ", ";
    auto used = std::make_shared<bool>(false);
    return Value::function("joiner", [sep, used](CallArgs&) {
      const bool first = !*used;
      *used = true;
      return Value::string(first ? "" : sep);
    });
  }));
  return g;
}

}  // namespace hybridflow::text::jinja
