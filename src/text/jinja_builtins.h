// The names a template can use beyond its data: filters (`x | trim`), tests (`x is string`), methods
// of strings, dicts and lists (`s.startswith(...)`), operators, and the global functions transformers
// provides. Everything here throws EvalFailure; the evaluator adds the template position.
#pragma once

#include <string>
#include <string_view>

#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

// Checked by the parser, so an unsupported filter or test fails when the template is parsed, naming it.
bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& input, CallArgs& args);
bool apply_test(const std::string& name, const Value& input, CallArgs& args);

// `obj.name`: as jinja2's getattr, an attribute (a method of str/dict/list, a namespace attribute) first,
// then the item obj['name']; Undefined if neither exists.
Value get_attribute(const Value& obj, const std::string& name);
// `obj[key]`: the item first, then (for a string key) the attribute.
Value get_item(const Value& obj, const Value& key);
// `obj[start:stop:step]` on a list, tuple or string (by code point), with Python's clamping; null parts are None.
Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python's binary operators: + - * / // % ** on numbers (and + / * on strings and lists), ~ on anything.
Value binary_op(const std::string& op, const Value& a, const Value& b);
// markupsafe.escape: & < > " ' as HTML entities; a Markup value is returned unchanged.
Value html_escape(const Value& v);
// A plain value combined with a Markup (by +, %, format): its str() escaped; Markup and numbers unchanged.
Value markup_operand(const Value& v);
// How jinja2 names an object in "has no attribute" messages: 'dict object', 'None', ...
std::string object_description(const Value& v);

// Python's printf-style `fmt % args`: args is a tuple, a dict (for %(name)s) or a single value.
std::string percent_format(const std::string& fmt, const Value& args);
// Fails as Python does for a value that cannot be a dict key or set member (a list, dict or namespace,
// or a tuple holding one): "unhashable type: 'list'".
void require_hashable(const Value& v);
// Python's `item in container`.
bool contains(const Value& container, const Value& item);

// The globals of transformers' chat template environment: range, dict, namespace, raise_exception,
// strftime_now, plus jinja2's cycler and joiner.
Dict global_functions();

// The message raise_exception() was called with: rethrown by the evaluator as TemplateError(message).
class TemplateRaised : public EvalFailure {
 public:
  explicit TemplateRaised(const std::string& message) : EvalFailure(message) {}
};

}  // namespace hybridflow::text::jinja
