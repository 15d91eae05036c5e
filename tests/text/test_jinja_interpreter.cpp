// The Jinja interpreter against jinja2 itself: each case renders a small template with a context in
// hybridflow and in the exact jinja2 environment transformers uses for chat templates
// (tests/text/chat_template_oracle.py), and the outputs must be byte-identical; where jinja2 raises,
// hybridflow must throw TemplateError. Errors hybridflow reports by design (unsupported features, the
// template's own raise_exception) are checked for their message and position.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hybridflow/text/chat_template.h"
#include "text/chat_template_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;

struct Case {
  std::string name;
  std::string source;
  json context = json::object();
};

// Every code point of the blocks where Unicode has case (Latin to Georgian and Greek extended, the
// letterlike and enclosed blocks, Cyrillic and Latin extensions, fullwidth, Deseret, Osage, Old
// Hungarian, Warang Citi, Medefaidrin, Adlam), with words split by spaces, for the case methods.
std::string cased_scripts_text() {
  const std::pair<char32_t, char32_t> blocks[] = {{0x41, 0x2FFF},     {0xA640, 0xA7FF},   {0xAB70, 0xABBF},
                                                   {0xFB00, 0xFB06},   {0xFF21, 0xFF5A},   {0x10400, 0x104FF},
                                                   {0x10C80, 0x10CFF}, {0x118A0, 0x118FF}, {0x16E40, 0x16E9F},
                                                   {0x1E900, 0x1E94B}};
  std::u32string text;
  int n = 0;
  for (auto [first, last] : blocks)
    for (char32_t c = first; c <= last; ++c) {
      text.push_back(c);
      if (++n % 6 == 0) text.push_back(U' ');
    }
  text += U" ΣΑΣ όσος ΌΣΟΣ. ǆemal ǅ ß ŉ ﬃ";
  std::string utf8;
  for (char32_t c : text) {
    if (c < 0x80) {
      utf8.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      utf8 += {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
    } else if (c < 0x10000) {
      utf8 += {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
               static_cast<char>(0x80 | (c & 0x3F))};
    } else {
      utf8 += {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
               static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
    }
  }
  return utf8;
}

const std::vector<Case>& cases() {
  static const std::vector<Case> all = {
      // Output of values: Python's str() of each type.
      {"print_scalars", "{{ 1 }}|{{ 1.0 }}|{{ 2.50 }}|{{ 1e16 }}|{{ 1e15 }}|{{ 0.0001 }}|{{ 0.00001 }}|{{ -0.0 }}|{{ true }}|{{ none }}|{{ 'a' }}"},
      {"print_containers", "{{ [1, 'a', \"it's\", none, true, 2.0] }}|{{ {'k': 'v', 'n': [1]} }}|{{ (1, 2) }}|{{ (1,) }}|{{ () }}"},
      {"print_input_data", "{{ data }}|{{ data.list }}|{{ data.f }}", {{"data", {{"f", 3.0}, {"list", {1, "x\ny", nullptr}}, {"s", "q'\"\\"}}}}},
      {"print_undefined", "[{{ missing }}]|{{ missing ~ 'x' }}|{{ missing | length }}|{{ missing | trim }}|{{ d.nope }}", {{"d", json::object()}}},
      // Whitespace control with trim_blocks and lstrip_blocks.
      {"trim_and_lstrip", "<ul>\n  {% for i in [1, 2] %}\n    <li>{{ i }}</li>\n  {% endfor %}\n</ul>\n"},
      {"dash_controls", "a  {%- if true -%}  b  {%- endif -%}  c {{- ' d ' -}} e\n\n{{- 'f' }}"},
      {"plus_disables_lstrip", "x\n    {%+ if true %}y{% endif +%}\nz"},
      {"comments", "a {# note #} b\n  {# line #}\nc {#- tight -#} d"},
      {"expression_then_block", "{{ 'v' }}   {% if true %}t{% endif %}\n  {{ 'w' }}\n"},
      {"trailing_newline_dropped", "line\n"},
      {"crlf_source", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc"},
      {"raw_block", "{% raw %}{{ not evaluated }} {% if %}{% endraw %}|{%- raw -%}  x  {%- endraw %}"},
      // Loops.
      {"loop_variables", "{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}"},
      {"loop_previtem_cycle", "{% for x in [1, 2, 3] %}{{ loop.previtem }}-{{ loop.nextitem }}-{{ loop.cycle('o', 'e') }};{% endfor %}"},
      {"loop_else_and_filter", "{% for x in [] %}x{% else %}empty{% endfor %}|{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% endfor %}"},
      {"loop_unpack_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k, v in d | items %}{{ k }}{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
       {{"d", {{"z", 1}, {"a", 2}, {"m", 3}}}}},
      {"loop_break_continue", "{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i > 4 %}{% break %}{% endif %}{{ i }}{% endfor %}"},
      {"loop_nested_and_scoping", "{% set x = 0 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}({{ x }}){% for j in [3] %}{{ loop.index }}{% endfor %}{% endfor %}<{{ x }}>"},
      {"loop_over_string_and_undefined", "{% for c in 'héllo' %}{{ c }}.{% endfor %}|{% for x in nothing %}x{% else %}none{% endfor %}"},
      // Assignments and namespaces.
      {"set_and_if_scope", "{% if true %}{% set y = 3 %}{% endif %}{{ y }}{% set a, b = 1, 2 %}{{ a }}{{ b }}"},
      {"set_block_with_filter", "{% set s | upper %}  inner {{ 1 }} {% endset %}[{{ s }}]"},
      {"namespace", "{% set ns = namespace(n=0, last=none) %}{% for i in [5, 6, 7] %}{% set ns.n = ns.n + i %}{% set ns.last = i %}{% endfor %}{{ ns.n }} {{ ns.last }}"},
      {"dict_global", "{% set d = dict(a=1, b='x') %}{{ d.a }}{{ d['b'] }}{{ d | length }}"},
      // Expressions.
      {"arithmetic", "{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 4 / 2 }} {{ 2 ** 3 ** 2 }} {{ 2 ** -1 }} {{ 1e300 * 1e300 }} {{ 1 + 2 * 3 - 4 }} {{ 1.5 + 1 }} {{ -1 | abs }} {{ true + 1 }} {{ 'ab' * 2 }} {{ [1] + [2] }}"},
      {"comparisons", "{{ 1 < 2 < 3 }} {{ 1 == 1.0 }} {{ 'a' < 'b' }} {{ [1, 2] == [1, 2] }} {{ none == none }} {{ 'x' != 'y' }} {{ 2 >= 2 }} {{ 1 in [1, 2] }} {{ 'b' in 'abc' }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"},
      {"logic_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ not [] }} {{ none or [] }}"},
      {"conditional_expression", "{{ 'y' if true else 'n' }}{{ 'y' if false else 'n' }}[{{ 'y' if false }}]{{ 'a' if false else 'b' if true else 'c' }}"},
      {"concat_tilde", "{{ 1 ~ 'a' ~ none ~ true ~ 2.0 ~ [1] }}"},
      {"string_literals", "{{ 'a\\nb\\t\\'\\\\' }}|{{ \"x\\u00e9\\x41\" }}|{{ 'adj' 'acent' }}|{{ 'uni ✓ 中' }}"},
      {"subscripts_and_slices", "{{ l[0] }}{{ l[-1] }}{{ l[1:] }}{{ l[:2] }}{{ l[::-1] }}{{ l[::2] }}{{ l[-2:] }}{{ l[5:] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[-1] }}{{ l.0 }}",
       {{"l", {1, 2, 3, 4}}, {"s", "añbc"}}},
      {"attribute_fallbacks", "{{ d.key }}{{ d['key'] }}{{ d.get('key') }}{{ d.get('no', 'dflt') }}{{ d.get('no') }}[{{ l[9] }}][{{ none.x }}]",
       {{"d", {{"key", "v"}}}, {"l", {1}}}},
      // Tests.
      {"tests_types", "{{ 'a' is string }}{{ 1 is number }}{{ 1.5 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ {} is mapping }}{{ [] is mapping }}{{ [] is iterable }}{{ 'a' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}{{ {} is sequence }}"},
      {"tests_values", "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ x is not none }}{{ t is true }}{{ 1 is true }}{{ f is false }}{{ t is boolean }}{{ 0 is boolean }}{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 2 is eq 2 }}{{ 'a' is in 'abc' }}{{ n is sameas none }}",
       {{"x", 1}, {"n", nullptr}, {"t", true}, {"f", false}}},
      {"tests_case", "{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ 'aB' is lower }}{{ 'upper' is filter }}{{ 'odd' is test }}"},
      // Filters.
      {"filters_strings", "[{{ '  a b  ' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ 'hello world-foo(bar) x<y>z [a]b {c}d' | title }}][{{ 'hELLO' | capitalize }}][{{ 'Ab' | lower }}{{ 'Ab' | upper }}][{{ 'a-b-c' | replace('-', '+') }}][{{ 'aaa' | replace('a', 'b', 2) }}]"},
      {"filters_collections", "{{ [3, 1, 2] | sort }}{{ ['b', 'A', 'c'] | sort }}{{ [3, 1, 2] | sort(reverse=true) }}{{ [1, 2, 2, 1] | unique | list }}{{ [1, 2] | first }}{{ [1, 2] | last }}{{ [1, 2] | length }}{{ 'abc' | count }}{{ 'ab' | list }}{{ [1, 2] | reverse | list }}{{ [1, 2, 3] | sum }}{{ [1, 5, 3] | max }}{{ [4, 2] | min }}"},
      {"filters_join_map_select", "{{ [1, 2, 3] | join(', ') }}|{{ users | map(attribute='name') | join(' ') }}|{{ users | selectattr('admin') | map(attribute='name') | list }}|{{ users | rejectattr('admin') | list | length }}|{{ [1, 2, 3, 4] | select('odd') | list }}|{{ [1, 2, 3] | reject('equalto', 2) | list }}|{{ users | selectattr('name', 'equalto', 'b') | first }}|{{ ['a', 'b'] | map('upper') | join }}",
       {{"users", {{{"name", "a"}, {"admin", true}}, {{"name", "b"}, {"admin", false}}}}}},
      {"filters_numbers", "{{ '42' | int }} {{ '4.7' | int }} {{ 'x' | int }} {{ 'x' | int(7) }} {{ 3.9 | int }} {{ '2.5' | float }} {{ 2 | float }} {{ 2.5 | round }} {{ 3.5 | round }} {{ 2.567 | round(2) }} {{ 2.1 | round(method='ceil') }} {{ 5 | string }}{{ none | string }}"},
      {"filters_default", "{{ missing | default('d') }}{{ missing | d('e') }}{{ '' | default('f') }}{{ '' | default('g', true) }}{{ none | default('h') }}{{ 0 | default('i', boolean=true) }}"},
      {"filter_tojson", "{{ data | tojson }}|{{ data | tojson(indent=2) }}|{{ 'é\"\\n<>&\\u2028' | tojson }}|{{ data | tojson(sort_keys=true) }}|{{ 1.0 | tojson }}|{{ [] | tojson(indent=2) }}|{{ data | tojson(separators=(',', ':')) }}|{{ 'é' | tojson(ensure_ascii=true) }}",
       {{"data", {{"z", {1, 2.5, nullptr, true}}, {"a", {{"nested", "ü"}}}, {"e", json::object()}, {"f", 1e20}}}}},
      {"filter_indent", "{{ 'a\\nb\\n\\nc' | indent }}|{{ 'a\\nb' | indent(2, true) }}|{{ 'a\\n\\nb' | indent(width='> ', blank=true) }}"},
      {"filters_escape_safe", "{{ '<a href=\"x\">&\\'' | e }}{{ '<b>' | escape }}{{ '<i>' | safe }}"},
      // Markup (what escape and safe return): escaping is idempotent, + and % escape the plain side.
      {"markup_semantics", "{{ s|e|e }}|{{ s|e + '<b>' }}|{{ '<b>' + s|e }}|{{ s|safe + '<i>' }}|{{ (s|e) ~ '<' }}|{{ [s|e, s|safe] }}|{{ s|e is escaped }}{{ s is escaped }}|{{ (s|e)|upper|e }}|{{ (s|safe)|trim|e }}|{{ (s|safe).replace('<', '>') }}|{{ ('%s<' | safe) % s }}|{{ ('<%s>' | safe) | format(s) }}|{{ ((s|safe) * 2)|e }}|{{ (s|safe)|title|e }}|{{ (s|safe)|replace('a', '<')|e }}|{{ ('x'|safe).join(['<', '>']) }}|{{ (s|safe)|tojson }}|{{ (s|safe)|indent(2)|e }}|{{ ['<', s|safe]|join }}",
       {{"s", "a<b>&'\""}}},
      {"filter_items_dictsort", "{{ d | items | list }}{{ d | dictsort }}{{ d | dictsort(by='value', reverse=true) }}", {{"d", {{"b", 1}, {"a", 2}}}}},
      {"filter_block", "{% filter upper %}shout {{ 'it' }}{% endfilter %}"},
      // String and dict methods.
      {"string_methods", "{{ '  x  '.strip() }}|{{ '\\n\\nx\\n'.lstrip('\\n') }}|{{ 'x!!'.rstrip('!') }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}|{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}{{ 'a b c'.split(' ', 1) }}{{ 'a b c'.rsplit(' ', 1) }}|{{ 'aXbX'.replace('X', '-') }}|{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ 'hi there'.title() }}{{ 'hI'.capitalize() }}|{{ 'abcabc'.find('c') }}{{ 'abc'.rfind('z') }}{{ 'aaa'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ '{} and {name}'.format(1, name='x') }}|{{ 'l1\\nl2'.splitlines() }}|{{ 'abc'.removeprefix('a') }}"},
      {"think_split", "{% set c = s.split('</think>')[-1].lstrip('\\n') %}{% set r = s.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}[{{ c }}][{{ r }}]",
       {{"s", "<think>\nreason\n</think>\n\nanswer"}}},
      {"dict_methods", "{{ d.keys() | list }}{{ d.values() | list }}{% for k, v in d.items() %}{{ k }}{{ v }}{% endfor %}{{ d.items is callable }}{{ d['items'] }}",
       {{"d", {{"b", 1}, {"a", 2}, {"items", "shadowed"}}}}},
      // Macros.
      {"macro_defaults_and_call", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}"},
      {"macro_caller", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('p') %}body {{ 1 }}{% endcall %}"},
      {"macro_recursion", "{% macro down(n) %}{{ n }}{% if n > 1 %}{{ down(n - 1) }}{% endif %}{% endmacro %}{{ down(5) }}"},
      {"with_block", "{% with a = 1, b = 2 %}{{ a + b }}{% endwith %}[{{ a }}]"},
      {"unicode_case_mapping", "{{ s | upper }}|{{ s | lower }}|{{ s.title() }}|{{ s.capitalize() }}|{{ s | title }}|{{ s.split() | length }}|{{ s.split() | map('upper') | select('upper') | list | length }}|{{ s.split() | select('lower') | list | length }}",
       {{"s", cased_scripts_text()}}},
      {"unicode_text", "{{ s | length }} {{ s | upper }} {{ s[1] }} {{ s | title }} {{ 'ÉCOLE' | lower }}", {{"s", "élan vital ✓ 中文 ΣΑΣ"}}},
      {"generation_block", "{% for m in ms %}{% generation %}{{ m }}{% endgeneration %}{% endfor %}", {{"ms", {"a", "b"}}}},
      // Printf-style formatting (the % operator and the format filter).
      {"percent_format", "{{ '%s-%d-%.2f-%5s-%-3d|%x %o %e %g %r %%' % ('a', 3, 2.5, 'b', 7, 255, 8, 12345.678, 0.0001, 'q') }}|{{ '%(a)s=%(b)d' % {'a': 'k', 'b': 2} }}|{{ '%s and %s' | format('x', 2) }}|{{ '%s' % [1, 2] }}|{{ '%s' % {'a': 1} }}|{{ '%05.1f%+d' % (3.14159, 4) }}"},
      // Lexing corner cases: closing delimiters inside strings and brackets.
      {"delimiters_inside_tags", "{{ {'a': {'b': 1}} }}|{{ '%}' }}|{% set x = '}}' %}{{ x }}|{{ [[1], [2]] }}|{# a '#}' b"},
      {"repr_of_strings", "{{ ['a\\nb', \"it's\", 'both\\'\"', '\\x7f', 'ü', '\\u200b', '\\\\', '\\t'] }}"},
      {"undefined_behaviour", "{{ u is sequence }}{{ u is iterable }}{{ u == u }}{{ u == none }}{{ u | list }}[{{ u | join }}][{{ u | first }}]{{ u | default('d') }}{{ not u }}{{ u is not defined }}"},
      // Idioms of real chat templates.
      {"content_parts", "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% elif p['type'] == 'image' %}<img>{% endif %}{% endfor %}{% endif %}|{% endfor %}",
       {{"messages", {{{"role", "user"}, {"content", "plain"}}, {{"role", "user"}, {"content", {{{"type", "image"}}, {{"type", "text"}, {"text", "caption"}}}}}}}}},
      {"system_extraction", "{% if messages[0]['role'] == 'system' %}{% set sys = messages[0]['content'] %}{% set rest = messages[1:] %}{% else %}{% set sys = 'default' %}{% set rest = messages %}{% endif %}[{{ sys }}]{% for m in rest %}{{ m.role }}{% if not loop.last %},{% endif %}{% endfor %}{{ messages | selectattr('role', 'equalto', 'user') | list | length }}",
       {{"messages", {{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "u"}}, {{"role", "assistant"}, {"content", "a"}}}}}},
      {"precedence", "{{ 'Tools: ' + tools | map(attribute='function.name') | join(', ') }}|{{ -x | abs }}|{{ not y is defined }}|{{ 'x' ~ 2 * 3 }}|{{ 1 + 2 * 3 ** 2 }}|{{ x is defined and x > 1 }}|{{ (1, 2)[1] }}|{{ [1, 2, 3][1:][0] }}",
       {{"x", 3}, {"tools", {{{"function", {{"name", "f1"}}}}, {{"function", {{"name", "f2"}}}}}}}},
      {"loop_tests_and_joiner", "{% set comma = joiner(', ') %}{% for i in range(1, 8, 2) %}{{ comma() }}{{ i }}{% if loop.index0 is divisibleby(2) %}e{% endif %}{% endfor %}|{% for i in range(3)|reverse %}{{ i }}{% endfor %}"},
      {"tojson_numbers", "{{ [0.1, 1e-7, 1e22, 123456789.0, -0.5, 3, 2.0e-5, 1.5e300] | tojson }}{{ {'a': [], 'b': {}, 'c': [{}]} | tojson(indent=1) }}"},
      {"namespace_flags", "{% set ns = namespace(found=false, count=0) %}{% for m in ms %}{% set ns.found = ns.found or m == 'x' %}{% if m == 'y' %}{% set ns.count = ns.count + 1 %}{% endif %}{% endfor %}{{ ns.found }}{{ ns.count }}{{ ns }}",
       {{"ms", {"y", "x", "y"}}}},
      {"whitespace_nested_blocks", "<s>\n\t{%- for m in ms %}\n\t\t{% if m %}\n\t\t\t{{ m }}\n\t\t{% endif %}\n\t{% endfor -%}\n</s>\n", {{"ms", {"a", "", "b"}}}},
      {"strftime_now_year", "{{ strftime_now('%Y') | length }}"},
      {"macro_scoping", "{% set g = 'G' %}{% macro m(a) %}{{ a }}{{ g }}{% set g = 'L' %}{{ g }}{% endmacro %}{{ m(1) }}{{ g }}{{ m(a=2) }}"},
      // Python corner cases found by comparing random expressions with jinja2.
      {"python_numeric_corners", "{{ 2.5 is odd }}{{ 3.0 is odd }}{{ 4.0 is even }}{{ 1e20 is divisibleby(2) }}|{{ 0 | round }}{{ 7 | round }}{{ 2.5 | round(method='floor') }}|{{ 7 // 0.1 }} {{ -7.5 // 2 }} {{ 0 % -1.5 }} {{ -1 % 3.0 }}"},
      {"lazy_filters_on_false", "{{ false | select('odd') | list }}{{ none | map('string') | list }}{{ 0 | rejectattr('x') | list }}"},
      {"undefined_in_containers", "{{ [u, 1] }}{{ u is callable }}{{ ('' | last) is callable }}"},
      {"percent_format_with_list_argument", "[{{ ' x ' % [1, 2] }}][{{ 'y' % {'a': 1} }}]"},
      // jinja2's compile-time scoping: a name assigned at a scope's top level is local to the whole scope,
      // so a macro called before the assignment sees Undefined, not the render variable.
      {"scope_read_before_assignment", "{{ x }}{% set x = 1 %}{{ x }}|{% if false %}{% set y = 1 %}{% endif %}{{ y }}", {{"x", "X0"}, {"y", "Y0"}}},
      {"scope_macro_before_assignment", "{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% set x = 1 %}{{ m() }}", {{"x", "X0"}}},
      {"scope_macro_after_top_level_read", "{{ x }}{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% set x = 1 %}{{ m() }}", {{"x", "X0"}}},
      {"scope_macro_in_loop", "{% for i in [1] %}{% macro m() %}[{{ x }}]{% endmacro %}{{ m() }}{% endfor %}{% set x = 1 %}|{% for i in [1, 2] %}{% macro n() %}<{{ y }}>{% endmacro %}{{ n() }}{% set y = i %}{% endfor %}", {{"x", "X0"}, {"y", "Y0"}}},
      {"scope_loop_aliases_outer", "{% set x = 1 %}{% for i in [1, 2] %}{% macro m() %}{{ x }}{% endmacro %}{{ m() }}{% set x = 5 %}{% endfor %}|{% for i in [1] %}{{ z }}{% set z = 5 %}{{ z }}{% endfor %}{{ z }}|{% for i in [1] %}[{{ w }}]{% set w = 5 %}{% endfor %}{% set w = 1 %}", {{"x", "X0"}, {"z", "Z0"}, {"w", "W0"}}},
      {"scope_macro_is_lexical", "{% macro m() %}{{ x }}{% endmacro %}{% for i in [1] %}{% set x = 7 %}{{ m() }}{% endfor %}|{% macro k() %}{{ x }}{% set x = 9 %}{{ x }}{% endmacro %}{{ k() }}{{ x }}", {{"x", "X0"}}},
      {"for_else_after_continue_or_break", "{% for i in [1, 2] %}{% continue %}{% else %}E1{% endfor %}|{% for i in [1, 2] %}{% break %}{% else %}E2{% endfor %}|{% for i in [1, 2] %}{% if i == 2 %}{% break %}{% endif %}{% else %}E3{% endfor %}"},
      // Errors jinja2 raises: hybridflow throws too.
      {"error_attribute_of_undefined", "{{ missing.attr }}"},
      {"error_raise_exception", "{{ raise_exception('Only user and assistant roles are supported!') }}"},
      {"error_iterate_number", "{% for x in 5 %}{% endfor %}"},
      {"error_add_string_and_number", "{{ 'a' + 1 }}"},
      {"error_tojson_undefined", "{{ missing | tojson }}"},
      {"error_unpack_mismatch", "{% for a, b in [[1, 2, 3]] %}{% endfor %}"},
      {"error_concat_binds_tighter_than_plus", "{{ 1 + 2 ~ 'a' }}"},
      {"error_item_of_undefined", "{{ missing[0] }}"},
      {"error_percent_arguments", "{{ '%s %s' % ('a',) }}"},
      {"error_compare_unorderable", "{{ [1, 'a'] | sort }}"},
      {"error_int_of_undefined", "{{ u | int }}"},
      {"error_float_power_overflow", "{{ 1e20 ** 1e20 }}"},
      {"error_complex_power", "{{ (-8) ** 0.5 < 1 }}"},
      {"error_unhashable_in_dict", "{{ [1] in {'a': 1} }}"},
      {"error_unique_of_lists", "{{ [[1], [1]] | unique | list }}"},
      {"error_runaway_macro_recursion", "{% macro r(n) %}{{ r(n) }}{% endmacro %}{{ r(1) }}"},
      {"error_indent_non_string", "{{ 5 | indent(2) }}"},
      {"error_zero_to_negative_power", "{{ 0 ** -1 }}"},
  };
  return all;
}

class JinjaAgainstJinja2 : public ::testing::TestWithParam<size_t> {
 protected:
  static void SetUpTestSuite() {
    json request = {{"jinja", json::array()}};
    for (const auto& c : cases()) request["jinja"].push_back({{"template", c.source}, {"context", c.context}});
    oracle_ = new testing::OracleAnswer(testing::ask_oracle(request));
  }
  static void TearDownTestSuite() {
    delete oracle_;
    oracle_ = nullptr;
  }
  static testing::OracleAnswer* oracle_;
};

testing::OracleAnswer* JinjaAgainstJinja2::oracle_ = nullptr;

TEST_P(JinjaAgainstJinja2, RendersAsJinja2Does) {
  ASSERT_EQ(oracle_->problem(), "");
  const Case& c = cases()[GetParam()];
  const json& expected = oracle_->answer["jinja"][GetParam()];
  SCOPED_TRACE("template: " + c.source);
  if (expected.contains("error")) {
    try {
      const std::string got = JinjaTemplate::parse(c.source).render(c.context);
      ADD_FAILURE() << "jinja2 raised " << expected["error"].get<std::string>() << " but hybridflow rendered:\n" << got;
    } catch (const TemplateError& e) {
      std::printf("%s: jinja2: %s | hybridflow: %s\n", c.name.c_str(), expected["error"].get<std::string>().c_str(), e.what());
    }
    return;
  }
  std::string got;
  try {
    got = JinjaTemplate::parse(c.source).render(c.context);
  } catch (const TemplateError& e) {
    FAIL() << "hybridflow threw: " << e.what() << "\njinja2 rendered:\n" << expected["output"].get<std::string>();
  }
  EXPECT_EQ(got, expected["output"].get<std::string>());
}

INSTANTIATE_TEST_SUITE_P(Cases, JinjaAgainstJinja2, ::testing::Range<size_t>(0, cases().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) { return cases()[info.param].name; });

// ---- errors hybridflow reports by design ----

TemplateError error_of(const std::string& source, const json& context = json::object()) {
  try {
    JinjaTemplate::parse(source).render(context);
  } catch (const TemplateError& e) {
    return e;
  }
  ADD_FAILURE() << "no TemplateError for: " << source;
  return TemplateError("none");
}

TEST(JinjaErrors, RaiseExceptionCarriesTheTemplatesMessage) {
  TemplateError e = error_of("line one\n{%- if true %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}");
  EXPECT_EQ(e.message(), "Conversation roles must alternate");
  EXPECT_EQ(e.line(), 2);
  EXPECT_NE(std::string(e.what()).find("Conversation roles must alternate"), std::string::npos);
}

TEST(JinjaErrors, UnsupportedFilterIsNamedWithLineAndColumn) {
  TemplateError e = error_of("ok\n  {{ x | wordwrap(3) }}");
  EXPECT_EQ(e.line(), 2);
  EXPECT_EQ(e.column(), 10);
  EXPECT_NE(e.message().find("unsupported filter 'wordwrap'"), std::string::npos) << e.what();
  EXPECT_NE(std::string(e.what()).find("line 2, column 10"), std::string::npos) << e.what();
}

TEST(JinjaErrors, UnsupportedTestTagAndMethodAreNamed) {
  EXPECT_NE(error_of("{% if x is prime %}{% endif %}").message().find("unsupported test 'prime'"), std::string::npos);
  TemplateError tag = error_of("a\nb {% include 'x.j2' %}");
  EXPECT_NE(tag.message().find("unsupported tag 'include'"), std::string::npos) << tag.what();
  EXPECT_EQ(tag.line(), 2);
  EXPECT_NE(error_of("{% frobnicate %}").message().find("unknown tag 'frobnicate'"), std::string::npos);
  TemplateError method = error_of("{{ 'x'.casefold() }}");
  EXPECT_NE(method.message().find("str.casefold"), std::string::npos) << method.what();
  EXPECT_NE(error_of("{{ d.update({}) }}", {{"d", json::object()}}).message().find("dict.update"), std::string::npos);
}

TEST(JinjaErrors, SyntaxErrorsHavePositions) {
  TemplateError unclosed = error_of("{% for x in y %}\n{{ x }}");
  EXPECT_NE(unclosed.message().find("'endfor'"), std::string::npos) << unclosed.what();
  TemplateError bad = error_of("{{ 1 +* 2 }}");
  EXPECT_EQ(bad.line(), 1);
  EXPECT_GT(bad.column(), 0);
  EXPECT_NE(error_of("{{ 'abc }}").message().find("unterminated string"), std::string::npos);
  EXPECT_NE(error_of("{% break %}").message().find("outside of a loop"), std::string::npos);
}

TEST(JinjaErrors, PathologicalNestingFailsInsteadOfOverflowingTheStack) {
  EXPECT_NE(error_of("{{ " + std::string(100000, '(') + "1" + std::string(100000, ')') + " }}").message().find("nests deeper"),
            std::string::npos);
  std::string loops;
  for (int i = 0; i < 1000; ++i) loops += "{% if true %}";
  EXPECT_NE(error_of(loops).message().find("nests deeper"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_NE(error_of(chain + " }}").message().find("nests deeper"), std::string::npos);
  EXPECT_NE(error_of("{{ " + std::string(100000, '-') + "1 }}").message().find("nests deeper"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(error_of(nots + "1 }}").message().find("nests deeper"), std::string::npos);
  // Ordinary depth is fine.
  EXPECT_EQ(JinjaTemplate::parse("{{ " + std::string(50, '(') + "1" + std::string(50, ')') + " }}").render(json::object()), "1");
}

TEST(JinjaErrors, NamespaceRejectsUnderscoreAttributesAsTransformersDoes) {
  EXPECT_NE(error_of("{% set ns = namespace() %}{% set ns._x = 1 %}").message().find("underscore"), std::string::npos);
}

}  // namespace
}  // namespace hybridflow::text
