// Binding a call's arguments to a builtin's parameters, as Python binds them: positional first, then
// keywords by name; too many, unknown or duplicate arguments fail naming the function.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

class BoundArgs {
 public:
  BoundArgs(const std::string& function, CallArgs& args, std::initializer_list<const char*> names)
      : function_(function), names_(names.begin(), names.end()), slots_(names.size()) {
    if (args.positional.size() > names_.size())
      throw EvalFailure(function + "() takes at most " + std::to_string(names_.size()) + " argument(s), got " +
                        std::to_string(args.positional.size()));
    for (size_t i = 0; i < args.positional.size(); ++i) slots_[i] = args.positional[i];
    for (auto& [key, v] : args.keyword) {
      size_t i = 0;
      while (i < names_.size() && key != names_[i]) ++i;
      if (i == names_.size()) throw EvalFailure(function + "() got an unexpected keyword argument '" + key + "'");
      if (slots_[i]) throw EvalFailure(function + "() got multiple values for argument '" + key + "'");
      slots_[i] = v;
    }
  }

  bool has(size_t i) const { return slots_[i].has_value(); }
  const Value& get(size_t i) const {
    if (!slots_[i]) throw EvalFailure(function_ + "() missing required argument '" + names_[i] + "'");
    return *slots_[i];
  }
  Value get_or(size_t i, Value fallback) const { return slots_[i] ? *slots_[i] : std::move(fallback); }
  bool flag(size_t i, bool fallback) const { return slots_[i] ? truthy(*slots_[i]) : fallback; }
  const std::string& string(size_t i) const {
    const Value& v = get(i);
    if (!v.is_string()) throw EvalFailure(function_ + "() argument '" + names_[i] + "' must be a string, not " + type_name(v));
    return v.as_string();
  }
  std::int64_t integer(size_t i) const {
    const Value& v = get(i);
    if (!v.is_integral()) throw EvalFailure(function_ + "() argument '" + names_[i] + "' must be an integer, not " + type_name(v));
    return v.as_int();
  }

 private:
  std::string function_;
  std::vector<std::string> names_;
  std::vector<std::optional<Value>> slots_;
};

}  // namespace hybridflow::text::jinja
