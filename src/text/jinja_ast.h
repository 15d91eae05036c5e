// The parsed form of a template: expressions and statements, evaluated by jinja_evaluator.cpp.
// One plain struct per category (rather than a class per node) keeps the parser and evaluator short;
// each Kind's comment says which fields it uses.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "text/jinja_lexer.h"
#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,      // literal
    Name,         // name
    List,         // operands: items
    Tuple,        // operands: items
    Dict,         // operands: key, value, key, value, ...
    GetAttr,      // operands[0].name
    GetItem,      // operands[0][operands[1]]
    Slice,        // operands[0][operands[1]:operands[2]:operands[3]], absent parts null
    Call,         // operands[0](operands[1..], kwargs)
    Filter,       // operands[0] | name(operands[1..], kwargs); operands[0] is null in a filter block
    Test,         // operands[0] is [not] name(operands[1..], kwargs); negated
    Negate,       // -operands[0] (name "-") or +operands[0] (name "+")
    Not,          // not operands[0]
    Binary,       // operands[0] <name> operands[1] for + - * / // % ** ~
    And,          // operands[0] and operands[1]
    Or,           // operands[0] or operands[1]
    Compare,      // operands[0] ops[0] operands[1] ops[1] ... (chained as in Python); ops: == != < <= > >= in notin
    Conditional,  // operands[0] if operands[1] else operands[2] (null: Undefined)
  };
  Kind kind;
  Location location;
  Value literal;
  std::string name;
  std::vector<ExprPtr> operands;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::string> ops;
  bool negated = false;
  int depth = 1;  // of this expression tree (the parser bounds it, so evaluating it cannot exhaust the stack)
};

// What `for` and `set` assign to: a name, names to unpack, or a namespace attribute (`ns.attr`).
struct Target {
  std::vector<std::string> names;  // one name, or the names of a tuple
  bool unpack = false;             // `a, b` (even with one name: `a,`)
  std::string attribute;           // non-empty: `names[0].attribute`
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Kind {
    Text,         // text: template text, written as is
    Print,        // {{ expr }}
    If,           // conditions[i] -> branches[i]; an else body is branches[conditions.size()] if present
    For,          // for target in expr [if condition] body [else else_body]
    Set,          // set target = expr
    SetBlock,     // set target [| filters in expr] body endset
    Macro,        // macro name(params) body endmacro
    CallBlock,    // call[(params)] expr body endcall: expr is a Call whose macro gets body as caller()
    FilterBlock,  // filter expr body endfilter: expr is a Filter chain with a null innermost input
    With,         // with targets[i] = values[i] body endwith
    Break,
    Continue,
    Generation,   // transformers' {% generation %} body {% endgeneration %}: renders body
  };
  Kind kind;
  Location location;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  Target target;
  std::vector<ExprPtr> conditions;
  std::vector<Body> branches;
  Body body;
  Body else_body;
  std::string name;
  std::vector<MacroParam> params;
  std::vector<Target> targets;
  std::vector<ExprPtr> values;
  // Filled by jinja_scoping: names the body's scope (and the for-else body's) must hold as Undefined
  // from its start, because jinja2 makes them local to that scope before their assignment runs.
  std::vector<std::string> undefined_at_entry;
  std::vector<std::string> else_undefined_at_entry;
};

}  // namespace hybridflow::text::jinja
