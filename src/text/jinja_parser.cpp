#include "text/jinja_parser.h"

#include <algorithm>
#include <initializer_list>

#include "hybridflow/text/template_error.h"
#include "text/jinja_builtins.h"

namespace hybridflow::text::jinja {
namespace {

using Type = Token::Type;

// Tags jinja2 has that chat templates do not need; naming them gives a clearer error than "unknown".
bool is_unsupported_jinja_tag(const std::string& name) {
  for (const char* t : {"include", "import", "from", "extends", "block", "autoescape", "do", "trans", "pluralize"})
    if (name == t) return true;
  return false;
}

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  Body parse() {
    Body body = parse_body({});
    return body;
  }

 private:
  // ---- token helpers ----
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const { return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)]; }
  const Token& advance() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool at_operator(const char* op) const { return current().type == Type::Operator && current().text == op; }
  bool at_name(const char* name) const { return current().type == Type::Name && current().text == name; }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case Type::Text: return "template text";
      case Type::VariableBegin: return "'{{'";
      case Type::VariableEnd: return "'}}'";
      case Type::BlockBegin: return "'{%'";
      case Type::BlockEnd: return "'%}'";
      case Type::End: return "end of template";
      case Type::String: return "string";
      default: return "'" + t.text + "'";
    }
  }

  [[noreturn]] void fail(const std::string& message, const Token& at) const {
    throw TemplateError(message, at.location.line, at.location.column);
  }
  [[noreturn]] void fail(const std::string& message) const { fail(message, current()); }

  void expect_operator(const char* op) {
    if (!at_operator(op)) fail(std::string("expected '") + op + "', found " + describe(current()));
    advance();
  }
  std::string expect_name() {
    if (current().type != Type::Name) fail("expected a name, found " + describe(current()));
    return advance().text;
  }
  void expect_block_end() {
    if (current().type != Type::BlockEnd) fail("expected '%}', found " + describe(current()));
    advance();
  }

  // Records the depth of a node built from parsed operands and fails when the tree gets too deep
  // (`1 + 1 + ...` builds depth without recursing in the parser).
  ExprPtr checked(ExprPtr e) {
    int deepest = 0;
    for (const auto& o : e->operands)
      if (o) deepest = std::max(deepest, o->depth);
    for (const auto& kw : e->kwargs)
      if (kw.second) deepest = std::max(deepest, kw.second->depth);
    e->depth = deepest + 1;
    if (e->depth > kMaxNesting)
      throw TemplateError("the template nests deeper than " + std::to_string(kMaxNesting) + " levels",
                          e->location.line, e->location.column);
    return e;
  }

  ExprPtr make(Expr::Kind kind, const Location& loc) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->location = loc;
    return e;
  }

  // ---- statements ----

  // Statements until a `{% name %}` with name in `ends` (the `{%` and the name are left for the caller
  // to check and consume) or, with no ends, until the end of the template.
  Body parse_body(std::initializer_list<const char*> ends) {
    NestingGuard guard(*this);
    Body body;
    while (true) {
      const Token& t = current();
      if (t.type == Type::End) {
        if (ends.size() == 0) return body;
        std::string names;
        for (const char* e : ends) names += std::string(names.empty() ? "" : " or ") + "'" + e + "'";
        fail("unexpected end of template, expected " + names);
      }
      if (t.type == Type::Text) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Text;
        s->location = t.location;
        s->text = t.text;
        body.push_back(std::move(s));
        advance();
      } else if (t.type == Type::VariableBegin) {
        auto s = std::make_unique<Stmt>();
        s->kind = Stmt::Kind::Print;
        s->location = t.location;
        advance();
        s->expr = parse_tuple(true);
        if (current().type != Type::VariableEnd) fail("expected '}}', found " + describe(current()));
        advance();
        body.push_back(std::move(s));
      } else if (t.type == Type::BlockBegin) {
        const Token& name = peek();
        if (name.type != Type::Name) fail("expected a tag name after '{%', found " + describe(name), name);
        for (const char* e : ends)
          if (name.text == e) {
            advance();  // '{%'; the caller consumes the name
            return body;
          }
        advance();
        body.push_back(parse_statement());
      } else {
        fail("unexpected " + describe(t));
      }
    }
  }

  StmtPtr parse_statement() {
    const Token& tag = current();
    const std::string name = tag.text;
    auto s = std::make_unique<Stmt>();
    s->location = tag.location;
    advance();
    if (name == "if") return parse_if(std::move(s));
    if (name == "for") return parse_for(std::move(s));
    if (name == "set") return parse_set(std::move(s));
    if (name == "macro") return parse_macro(std::move(s));
    if (name == "call") return parse_call_block(std::move(s));
    if (name == "filter") return parse_filter_block(std::move(s));
    if (name == "with") return parse_with(std::move(s));
    if (name == "generation") {
      s->kind = Stmt::Kind::Generation;
      expect_block_end();
      s->body = parse_body({"endgeneration"});
      advance();
      expect_block_end();
      return s;
    }
    if (name == "break" || name == "continue") {
      if (loop_depth_ == 0) fail("'" + name + "' outside of a loop", tag);
      s->kind = name == "break" ? Stmt::Kind::Break : Stmt::Kind::Continue;
      expect_block_end();
      return s;
    }
    if (is_unsupported_jinja_tag(name)) fail("unsupported tag '" + name + "'", tag);
    fail("unknown tag '" + name + "'", tag);
  }

  StmtPtr parse_if(StmtPtr s) {
    s->kind = Stmt::Kind::If;
    while (true) {
      s->conditions.push_back(parse_tuple(false));
      expect_block_end();
      s->branches.push_back(parse_body({"elif", "else", "endif"}));
      const std::string which = advance().text;
      if (which == "elif") continue;
      if (which == "else") {
        expect_block_end();
        s->branches.push_back(parse_body({"endif"}));
        advance();
      }
      expect_block_end();
      return s;
    }
  }

  StmtPtr parse_for(StmtPtr s) {
    s->kind = Stmt::Kind::For;
    s->target = parse_target(/*allow_attribute=*/false);
    if (!at_name("in")) fail("expected 'in' in for loop, found " + describe(current()));
    advance();
    s->expr = parse_tuple(false, /*stop_at_if=*/true);
    if (at_name("if")) {
      advance();
      s->condition = parse_expression(true);
    }
    if (at_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    s->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (advance().text == "else") {
      expect_block_end();
      s->else_body = parse_body({"endfor"});
      advance();
    }
    expect_block_end();
    return s;
  }

  StmtPtr parse_set(StmtPtr s) {
    s->target = parse_target(/*allow_attribute=*/true);
    if (at_operator("=")) {
      advance();
      s->kind = Stmt::Kind::Set;
      s->expr = parse_tuple(true);
      expect_block_end();
      return s;
    }
    s->kind = Stmt::Kind::SetBlock;
    if (at_operator("|")) s->expr = parse_filter_chain(nullptr);
    expect_block_end();
    s->body = parse_body({"endset"});
    advance();
    expect_block_end();
    return s;
  }

  StmtPtr parse_macro(StmtPtr s) {
    s->kind = Stmt::Kind::Macro;
    s->name = expect_name();
    s->params = parse_params();
    expect_block_end();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;  // a loop around the definition is not a loop around the body
    s->body = parse_body({"endmacro"});
    loop_depth_ = saved_depth;
    advance();
    expect_block_end();
    return s;
  }

  std::vector<MacroParam> parse_params() {
    std::vector<MacroParam> params;
    expect_operator("(");
    while (!at_operator(")")) {
      if (!params.empty()) expect_operator(",");
      if (at_operator(")")) break;
      MacroParam p;
      p.name = expect_name();
      if (at_operator("=")) {
        advance();
        p.default_value = parse_expression(true);
      }
      params.push_back(std::move(p));
    }
    advance();
    return params;
  }

  StmtPtr parse_call_block(StmtPtr s) {
    s->kind = Stmt::Kind::CallBlock;
    if (at_operator("(")) s->params = parse_params();
    s->expr = parse_expression(true);
    if (s->expr->kind != Expr::Kind::Call) fail("expected a macro call in the call block", current());
    expect_block_end();
    s->body = parse_body({"endcall"});
    advance();
    expect_block_end();
    return s;
  }

  StmtPtr parse_filter_block(StmtPtr s) {
    s->kind = Stmt::Kind::FilterBlock;
    // The first filter has no '|' before it: parse it as a chain starting at a virtual '|'.
    s->expr = parse_filter_chain(nullptr, /*leading_pipe=*/false);
    expect_block_end();
    s->body = parse_body({"endfilter"});
    advance();
    expect_block_end();
    return s;
  }

  StmtPtr parse_with(StmtPtr s) {
    s->kind = Stmt::Kind::With;
    while (current().type != Type::BlockEnd) {
      if (!s->targets.empty()) expect_operator(",");
      s->targets.push_back(parse_target(false));
      expect_operator("=");
      s->values.push_back(parse_expression(true));
    }
    expect_block_end();
    s->body = parse_body({"endwith"});
    advance();
    expect_block_end();
    return s;
  }

  Target parse_target(bool allow_attribute) {
    Target t;
    const bool parenthesized = at_operator("(");
    if (parenthesized) advance();
    t.names.push_back(expect_name());
    if (allow_attribute && at_operator(".")) {
      advance();
      t.attribute = expect_name();
      return t;
    }
    while (at_operator(",")) {
      advance();
      t.unpack = true;
      if (current().type != Type::Name || at_name("in")) break;
      t.names.push_back(expect_name());
    }
    if (parenthesized) expect_operator(")");
    return t;
  }

  // ---- expressions (jinja2's precedence, loosest first) ----

  bool at_tuple_end(bool stop_at_if) const {
    const Token& t = current();
    if (t.type == Type::VariableEnd || t.type == Type::BlockEnd || t.type == Type::End) return true;
    if (t.type == Type::Operator && (t.text == ")" || t.text == "]" || t.text == "}")) return true;
    return stop_at_if && t.type == Type::Name && (t.text == "if" || t.text == "recursive");
  }

  // `a` or `a, b, ...` (a tuple); with_condexpr=false where `if` means something else (if tags, for loops).
  ExprPtr parse_tuple(bool with_condexpr, bool stop_at_if = false) {
    const Location loc = current().location;
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty()) {
        if (!at_operator(",")) break;
        advance();
        is_tuple = true;
        if (at_tuple_end(stop_at_if)) break;
      }
      items.push_back(parse_expression(with_condexpr));
    }
    if (!is_tuple) return std::move(items[0]);
    auto e = make(Expr::Kind::Tuple, loc);
    e->operands = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool with_condexpr) { return with_condexpr ? parse_conditional() : parse_or(); }

  ExprPtr parse_conditional() {
    NestingGuard guard(*this);
    ExprPtr body = parse_or();
    while (at_name("if")) {
      const Location loc = current().location;
      advance();
      ExprPtr condition = parse_or();
      ExprPtr otherwise;
      if (at_name("else")) {
        advance();
        otherwise = parse_conditional();
      }
      auto e = make(Expr::Kind::Conditional, loc);
      e->operands.push_back(std::move(body));
      e->operands.push_back(std::move(condition));
      e->operands.push_back(std::move(otherwise));
      body = checked(std::move(e));
    }
    return body;
  }

  ExprPtr binary(Expr::Kind kind, std::string op, ExprPtr left, ExprPtr right, const Location& loc) {
    auto e = make(kind, loc);
    e->name = std::move(op);
    e->operands.push_back(std::move(left));
    e->operands.push_back(std::move(right));
    return checked(std::move(e));
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (at_name("or")) {
      const Location loc = advance().location;
      left = binary(Expr::Kind::Or, "or", std::move(left), parse_and(), loc);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (at_name("and")) {
      const Location loc = advance().location;
      left = binary(Expr::Kind::And, "and", std::move(left), parse_not(), loc);
    }
    return left;
  }

  ExprPtr parse_not() {
    NestingGuard guard(*this);
    if (at_name("not")) {
      auto e = make(Expr::Kind::Not, advance().location);
      e->operands.push_back(parse_not());
      return checked(std::move(e));
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const Location loc = current().location;
    ExprPtr first = parse_math1();
    std::vector<ExprPtr> operands;
    std::vector<std::string> ops;
    while (true) {
      const Token& t = current();
      if (t.type == Type::Operator &&
          (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">=")) {
        ops.push_back(advance().text);
      } else if (at_name("in")) {
        advance();
        ops.push_back("in");
      } else if (at_name("not") && peek().type == Type::Name && peek().text == "in") {
        advance();
        advance();
        ops.push_back("notin");
      } else {
        break;
      }
      operands.push_back(parse_math1());
    }
    if (ops.empty()) return first;
    auto e = make(Expr::Kind::Compare, loc);
    e->operands.push_back(std::move(first));
    for (auto& o : operands) e->operands.push_back(std::move(o));
    e->ops = std::move(ops);
    return checked(std::move(e));
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (at_operator("+") || at_operator("-")) {
      const Token& op = advance();
      left = binary(Expr::Kind::Binary, op.text, std::move(left), parse_concat(), op.location);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (at_operator("~")) {
      const Token& op = advance();
      left = binary(Expr::Kind::Binary, "~", std::move(left), parse_math2(), op.location);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (at_operator("*") || at_operator("/") || at_operator("//") || at_operator("%")) {
      const Token& op = advance();
      left = binary(Expr::Kind::Binary, op.text, std::move(left), parse_pow(), op.location);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (at_operator("**")) {  // left-associative in jinja2, unlike Python
      const Token& op = advance();
      left = binary(Expr::Kind::Binary, "**", std::move(left), parse_unary(true), op.location);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    NestingGuard guard(*this);
    ExprPtr node;
    if (at_operator("-") || at_operator("+")) {
      const Token& op = advance();
      node = make(Expr::Kind::Negate, op.location);
      node->name = op.text;
      node->operands.push_back(parse_unary(false));
      node = checked(std::move(node));
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = current();
    switch (t.type) {
      case Type::Name: {
        auto e = make(Expr::Kind::Literal, t.location);
        if (t.text == "true" || t.text == "True") {
          e->literal = Value::boolean(true);
        } else if (t.text == "false" || t.text == "False") {
          e->literal = Value::boolean(false);
        } else if (t.text == "none" || t.text == "None") {
          e->literal = Value::none();
        } else {
          e->kind = Expr::Kind::Name;
          e->name = t.text;
        }
        advance();
        return e;
      }
      case Type::String: {
        auto e = make(Expr::Kind::Literal, t.location);
        std::string s;
        while (current().type == Type::String) s += advance().text;  // adjacent literals concatenate
        e->literal = Value::string(std::move(s));
        return e;
      }
      case Type::Integer: {
        auto e = make(Expr::Kind::Literal, t.location);
        try {
          e->literal = Value::integer(std::stoll(t.text));
        } catch (const std::out_of_range&) {
          fail("integer literal " + t.text + " is too large (64-bit signed only)");
        }
        advance();
        return e;
      }
      case Type::Float: {
        auto e = make(Expr::Kind::Literal, t.location);
        e->literal = Value::number(std::stod(t.text));
        advance();
        return e;
      }
      case Type::Operator:
        if (t.text == "(") {
          const Location loc = advance().location;
          if (at_operator(")")) {
            advance();
            auto e = make(Expr::Kind::Tuple, loc);
            return e;
          }
          // Parenthesized: a tuple only with a comma; `(a if b else c)` is allowed.
          ExprPtr inner = parse_tuple(true);
          expect_operator(")");
          return inner;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::List, advance().location);
          while (!at_operator("]")) {
            if (!e->operands.empty()) expect_operator(",");
            if (at_operator("]")) break;
            e->operands.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::Dict, advance().location);
          while (!at_operator("}")) {
            if (!e->operands.empty()) expect_operator(",");
            if (at_operator("}")) break;
            e->operands.push_back(parse_expression(true));
            expect_operator(":");
            e->operands.push_back(parse_expression(true));
          }
          advance();
          return e;
        }
        break;
      default:
        break;
    }
    fail("unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (at_operator(".")) {
        const Location loc = advance().location;
        if (current().type == Type::Integer) {
          auto e = make(Expr::Kind::GetItem, loc);
          e->operands.push_back(std::move(node));
          auto index = make(Expr::Kind::Literal, current().location);
          index->literal = Value::integer(std::stoll(advance().text));
          e->operands.push_back(std::move(index));
          node = checked(std::move(e));
        } else {
          auto e = make(Expr::Kind::GetAttr, loc);
          e->name = expect_name();
          e->operands.push_back(std::move(node));
          node = checked(std::move(e));
        }
      } else if (at_operator("[")) {
        node = parse_subscript(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const Location loc = advance().location;  // '['
    ExprPtr parts[3];
    bool is_slice = false;
    if (!at_operator(":")) parts[0] = parse_expression(true);
    if (at_operator(":")) {
      is_slice = true;
      advance();
      if (!at_operator("]") && !at_operator(":")) parts[1] = parse_expression(true);
      if (at_operator(":")) {
        advance();
        if (!at_operator("]")) parts[2] = parse_expression(true);
      }
    }
    if (at_operator(",")) fail("tuple subscripts (x[a, b]) are not supported");
    expect_operator("]");
    auto e = make(is_slice ? Expr::Kind::Slice : Expr::Kind::GetItem, loc);
    e->operands.push_back(std::move(node));
    for (int i = 0; i < (is_slice ? 3 : 1); ++i) e->operands.push_back(std::move(parts[i]));
    return checked(std::move(e));
  }

  // `(args)` after a callee, filter or test name: positional and keyword arguments into `e`.
  void parse_arguments(Expr& e) {
    expect_operator("(");
    bool first = true;
    while (!at_operator(")")) {
      if (!first) expect_operator(",");
      first = false;
      if (at_operator(")")) break;
      if (at_operator("*") || at_operator("**")) fail("*args and **kwargs in calls are not supported");
      if (current().type == Type::Name && peek().type == Type::Operator && peek().text == "=") {
        std::string key = advance().text;
        advance();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail("positional argument after keyword argument");
        e.operands.push_back(parse_expression(true));
      }
    }
    advance();
  }

  ExprPtr parse_call(ExprPtr callee) {
    auto e = make(Expr::Kind::Call, callee->location);  // errors point at what is called
    e->operands.push_back(std::move(callee));
    parse_arguments(*e);
    return checked(std::move(e));
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (at_operator("|")) {
        node = parse_filter_chain(std::move(node));
      } else if (at_name("is")) {
        node = parse_test(std::move(node));
      } else if (at_operator("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  // Filter or test names may be dotted in jinja2 (`a.b`); chat templates use plain names.
  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (at_operator(".") && peek().type == Type::Name) {
      advance();
      name += "." + advance().text;
    }
    return name;
  }

  // One or more `| name(args)` applied to `input` (null: a filter block's or set block's body).
  ExprPtr parse_filter_chain(ExprPtr input, bool leading_pipe = true) {
    bool first = true;
    while ((first && !leading_pipe) || at_operator("|")) {
      if (!(first && !leading_pipe)) advance();
      first = false;
      const Token& name_token = current();
      auto e = make(Expr::Kind::Filter, name_token.location);
      e->name = parse_dotted_name();
      if (!is_known_filter(e->name)) fail("unsupported filter '" + e->name + "'", name_token);
      e->operands.push_back(std::move(input));
      if (at_operator("(")) parse_arguments(*e);
      input = checked(std::move(e));
    }
    return input;
  }

  ExprPtr parse_test(ExprPtr node) {
    advance();  // 'is'
    bool negated = false;
    if (at_name("not")) {
      advance();
      negated = true;
    }
    const Token& name_token = current();
    auto e = make(Expr::Kind::Test, name_token.location);
    e->name = parse_dotted_name();
    if (!is_known_test(e->name)) fail("unsupported test '" + e->name + "'", name_token);
    e->negated = negated;
    e->operands.push_back(std::move(node));
    if (at_operator("(")) {
      parse_arguments(*e);
    } else {
      // jinja2 also takes one argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
      const Token& t = current();
      const bool starts_argument =
          t.type == Type::Name || t.type == Type::String || t.type == Type::Integer || t.type == Type::Float ||
          (t.type == Type::Operator && (t.text == "[" || t.text == "{"));
      if (starts_argument && !at_name("else") && !at_name("or") && !at_name("and")) {
        e->operands.push_back(parse_postfix(parse_primary()));
      }
    }
    return checked(std::move(e));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int loop_depth_ = 0;

  // Templates come from model repositories, so a pathological nesting must fail cleanly instead of
  // exhausting the stack (in the parser, and later in the evaluator, which recurses the same way).
  static constexpr int kMaxNesting = 256;
  int nesting_ = 0;
  struct NestingGuard {
    Parser& p;
    explicit NestingGuard(Parser& parser) : p(parser) {
      if (++p.nesting_ > kMaxNesting) {
        --p.nesting_;
        p.fail("the template nests deeper than " + std::to_string(kMaxNesting) + " levels");
      }
    }
    ~NestingGuard() { --p.nesting_; }
  };
};

}  // namespace

Body parse_template(const std::string& source) { return Parser(tokenize(source)).parse(); }

}  // namespace hybridflow::text::jinja
