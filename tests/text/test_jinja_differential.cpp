// Randomized differential test: templates generated from a fixed seed (random expressions over
// literals, data, operators, filters and tests; random nestings of tags with whitespace-control
// modifiers around text full of spaces, tabs and newlines; random nestings of loops, conditions,
// assignments, macros, with and set blocks, namespaces and loop controls) are rendered by hybridflow and by jinja2 in
// transformers' environment (tests/text/chat_template_oracle.py). Outputs must be byte-identical, and
// where jinja2 raises hybridflow must throw. The seed is fixed so a failure reproduces; the case is
// printed in full.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "hybridflow/text/chat_template.h"
#include "text/chat_template_oracle.h"

namespace hybridflow::text {
namespace {

using json = nlohmann::ordered_json;

constexpr int kExpressionCases = 400;
constexpr int kWhitespaceCases = 400;
constexpr int kStatementCases = 300;

class Generator {
 public:
  explicit Generator(unsigned seed) : rng_(seed) {}

  // A random expression of the given depth.
  std::string expression(int depth) {
    static const std::vector<std::string> atoms = {
        "1", "0", "(-3)", "2.5", "0.1", "1e20", "'a'", "''", "'Hello World'", "' x '", "'a,b'", "none", "true",
        "false", "[]", "[1, 2, 3]", "['b', 'a']", "{}", "{'k': 1, 'j': [2]}", "(1, 'x')", "s", "n", "f", "l", "d",
        "u", "e", "d.k", "d['j']", "l[0]", "l[-1]", "s[1:]", "l[::-1]", "s.upper()", "s.split(',')", "d.get('k')",
        "d.items()|list", "nested.a.b", "nested['a']['c']", "l|length", "'é中'", "t"};
    static const std::vector<std::string> operators = {"+", "-", "*", "/", "//", "%", "~", "==", "!=", "<",
                                                       ">", "<=", ">=", "and", "or", "in", "not in", "**"};
    static const std::vector<std::string> filters = {
        "length", "string", "lower", "upper", "trim", "first", "last", "list", "tojson", "int", "float", "abs",
        "title", "capitalize", "reverse|list", "sort", "unique|list", "join(',')", "default('D')", "d(1, true)",
        "items|list", "replace('a', 'b')", "round", "sum", "min", "max", "tojson(indent=2)", "count", "dictsort",
        "select('odd')|list", "map('string')|list", "wordcount", "e", "safe", "escape|e"};
    static const std::vector<std::string> tests = {
        "defined", "undefined", "none", "string", "number", "integer", "float", "mapping", "iterable", "sequence",
        "true", "false", "boolean", "odd", "even", "callable", "lower", "upper", "divisibleby(2)", "in([1, 'a'])", "eq 1"};
    const double r = uniform();
    if (depth <= 0 || r < 0.3) return pick(atoms);
    if (r < 0.55) return "(" + expression(depth - 1) + " " + pick(operators) + " " + expression(depth - 1) + ")";
    if (r < 0.7) return "(" + expression(depth - 1) + "|" + pick(filters) + ")";
    if (r < 0.8) return "(" + expression(depth - 1) + " is " + (uniform() < 0.3 ? "not " : "") + pick(tests) + ")";
    if (r < 0.87) return "(" + expression(depth - 1) + " if " + expression(depth - 1) + " else " + expression(depth - 1) + ")";
    if (r < 0.93) return "(not " + expression(depth - 1) + ")";
    return "[" + expression(depth - 1) + ", " + expression(depth - 1) + "]";
  }

  // Random text and tags nested to the given depth, each tag with random whitespace modifiers.
  std::string body(int depth) {
    std::string out;
    const int parts = 1 + static_cast<int>(uniform() * 4);
    for (int i = 0; i < parts; ++i) {
      out += text();
      const double r = uniform();
      if (depth > 0 && r < 0.25) {
        out += tag("if true") + body(depth - 1) + tag("endif");
      } else if (depth > 0 && r < 0.45) {
        out += tag("for i in [1, 2]") + body(depth - 1) + tag("endfor");
      } else {
        const double k = uniform();
        if (k < 0.3) {
          out += "{{" + strip_modifier() + " i " + strip_modifier() + "}}";
        } else if (k < 0.55) {
          out += "{#" + modifier() + " c " + modifier() + "#}";
        } else if (k < 0.8) {
          out += tag("set y = 1");
        } else {
          out += "{%" + strip_modifier() + " raw " + strip_modifier() + "%} {{ r }} " + tag("endraw");
        }
      }
    }
    return out + text();
  }

  // Random statements nested to the given depth, reading and assigning a few shared names, so that
  // scoping (loop bodies, macros, with blocks, namespaces) decides the output.
  std::string statement(int depth, bool in_loop = false) {
    // `loop.*` only inside loops: outside one, reading an attribute of Undefined ends the render.
    static const std::vector<std::string> anywhere = {
        "x", "y", "i", "j", "k", "ns.a", "ns.b", "outer", "1", "'s'", "x ~ 'q'", "(y or 0) + 1", "ns.a + 1", "i * 2",
        "m", "messages|length", "messages[0].role", "messages[-1]['content']", "caller() if caller is defined else 'nc'"};
    static const std::vector<std::string> looping = [] {
      std::vector<std::string> v = anywhere;
      for (const char* x : {"loop.index", "loop.first", "loop.last", "loop.length", "loop.revindex0", "loop.previtem",
                            "loop.nextitem", "m.role if m is mapping else m", "m.content|upper if m is mapping else m"})
        v.push_back(x);
      return v;
    }();
    const std::vector<std::string>& values = in_loop ? looping : anywhere;
    static const std::vector<std::string> iterables = {"[1, 2, 3]", "messages", "range(2)", "messages[::-1]", "[]",
                                                       "d.items()", "'ab'"};
    static const std::vector<std::string> set_targets = {"x", "y", "ns.a", "ns.b", "outer"};
    const double r = uniform();
    if (depth > 0 && r < 0.2) {
      const std::string it = pick(iterables);
      static const std::vector<std::string> plain = {"i", "j", "m"};
      const std::string target = it == "d.items()" ? "k, v" : (it == "messages" || it == "messages[::-1]") ? "m" : pick(plain);
      std::string inner;
      const int n = 1 + static_cast<int>(uniform() * 3);
      for (int i = 0; i < n; ++i) inner += statement(depth - 1, true);
      if (uniform() < 0.2) inner += "{% if " + pick(values) + " %}{% break %}{% endif %}";
      if (uniform() < 0.2) inner = "{% if " + pick(values) + " %}{% continue %}{% endif %}" + inner;
      const std::string condition = uniform() < 0.3 ? " if " + target.substr(0, 1) + " != 2" : "";
      const std::string otherwise = uniform() < 0.3 ? "{% else %}E" : "";
      return "{% for " + target + " in " + it + condition + " %}" + inner + otherwise + "{% endfor %}";
    }
    if (depth > 0 && r < 0.35)
      return "{% if " + pick(values) + " %}" + statement(depth - 1, in_loop) + statement(depth - 1, in_loop) +
             "{% elif " + pick(values) + " %}A{% else %}" + statement(depth - 1, in_loop) + "{% endif %}";
    if (r < 0.5) return "{% set " + pick(set_targets) + " = " + pick(values) + " %}";
    if (depth > 0 && r < 0.55)
      return "{% macro mac(p, q=2) %}[{{ p }}{{ q }}{{ x }}" + statement(depth - 1) + "]{% endmacro %}{{ mac(" +
             pick(values) + ") }}";
    if (depth > 0 && r < 0.6)
      return "{% with w = " + pick(values) + " %}{{ w }}" + statement(depth - 1, in_loop) + "{% endwith %}";
    if (depth > 0 && r < 0.63) return "{% set blk %}" + statement(depth - 1, in_loop) + "{% endset %}<{{ blk }}>";
    return "{{ " + pick(values) + " }},";
  }

 private:
  double uniform() { return std::uniform_real_distribution<double>(0.0, 1.0)(rng_); }
  const std::string& pick(const std::vector<std::string>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng_)];
  }
  std::string modifier() {
    static const std::vector<std::string> m = {"", "", "-", "+"};
    return pick(m);
  }
  std::string strip_modifier() {
    static const std::vector<std::string> m = {"", "-"};
    return pick(m);
  }
  std::string tag(const std::string& inner) { return "{%" + modifier() + " " + inner + " " + modifier() + "%}"; }
  std::string text() {
    static const std::vector<std::string> pieces = {
        "", " ", "  ", "\t", "\n", "\n  ", "  \n", "a", " b ", "\n\n", "x\n  ", "\n\t", "\r\n", " \n \n ",
        "\u00a0", "\u3000 \n", "{", "}", "%}", "#", "\x0b", "\x1c"};
    std::string out;
    const int n = static_cast<int>(uniform() * 4);
    for (int i = 0; i < n; ++i) out += pick(pieces);
    return out;
  }
  std::mt19937 rng_;
};

struct Case {
  std::string source;
  json context;
};

const std::vector<Case>& cases() {
  static const std::vector<Case> all = [] {
    std::vector<Case> v;
    Generator g(20261124);
    const json data = {{"s", "a,b, c"}, {"n", 7}, {"f", -1.5}, {"l", {3, 1, 2}}, {"d", {{"k", "v"}, {"j", {1, 2}}}},
                       {"e", ""}, {"t", true}, {"nested", {{"a", {{"b", "deep"}}}}}};
    for (int i = 0; i < kExpressionCases; ++i) v.push_back({"{{ " + g.expression(3) + " }}", data});
    for (int i = 0; i < kWhitespaceCases; ++i) v.push_back({g.body(2), {{"i", 0}}});
    const json chat = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
                       {"d", {{"a", 1}, {"b", 2}}},
                       {"x", "X0"}};
    for (int i = 0; i < kStatementCases; ++i) {
      std::string source = "{% set ns = namespace(a=0, b='') %}";
      for (int k = 0; k < 3; ++k) source += g.statement(3);
      v.push_back({source + "|{{ x }}{{ y }}{{ ns.a }}{{ ns.b }}{{ outer }}", chat});
    }
    return v;
  }();
  return all;
}

TEST(JinjaDifferential, RandomTemplatesRenderAsInJinja2) {
  json request = {{"jinja", json::array()}};
  for (const auto& c : cases()) request["jinja"].push_back({{"template", c.source}, {"context", c.context}});
  testing::OracleAnswer oracle = testing::ask_oracle(request);
  ASSERT_EQ(oracle.problem(), "");
  int compared = 0, raised = 0, mismatches = 0;
  for (size_t i = 0; i < cases().size(); ++i) {
    const Case& c = cases()[i];
    const json& expected = oracle.answer["jinja"][i];
    std::string got, error;
    try {
      got = JinjaTemplate::parse(c.source).render(c.context);
    } catch (const TemplateError& e) {
      error = e.what();
    }
    ++compared;
    if (expected.contains("error")) {
      ++raised;
      if (error.empty()) {
        ++mismatches;
        ADD_FAILURE() << "case " << i << ": jinja2 raised " << expected["error"] << " but hybridflow rendered "
                      << json(got) << "\ntemplate: " << json(c.source);
      }
    } else if (!error.empty() || got != expected["output"].get<std::string>()) {
      ++mismatches;
      ADD_FAILURE() << "case " << i << ": jinja2 rendered " << expected["output"] << " but hybridflow "
                    << (error.empty() ? "rendered " + json(got).dump() : "threw: " + error) << "\ntemplate: " << json(c.source);
    }
    if (mismatches >= 10) break;
  }
  std::printf("compared %d random templates with jinja2 (%d where both raise)\n", compared, raised);
  EXPECT_EQ(compared, kExpressionCases + kWhitespaceCases + kStatementCases);
}

}  // namespace
}  // namespace hybridflow::text
