#include "text/jinja_scoping.h"

#include <map>
#include <set>

namespace hybridflow::text::jinja {
namespace {

// How a scope first refers to a name, in source order (jinja2's symbol loads).
enum class FirstUse { Load, Store };

using Uses = std::map<std::string, FirstUse>;
using Ancestors = std::vector<const Uses*>;

void note(Uses& uses, const std::string& name, FirstUse use) { uses.emplace(name, use); }

void note_loads(const Expr* e, Uses& uses) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::Name) note(uses, e->name, FirstUse::Load);
  for (const auto& o : e->operands) note_loads(o.get(), uses);
  for (const auto& kw : e->kwargs) note_loads(kw.second.get(), uses);
}

void note_store(const Target& t, Uses& uses, bool in_branch) {
  if (!t.attribute.empty()) {  // `ns.attr = ...` reads ns
    note(uses, t.names[0], FirstUse::Load);
    return;
  }
  // A store inside an if branch does not make the name start Undefined (jinja2 resolves it from outside).
  for (const auto& n : t.names) note(uses, n, in_branch ? FirstUse::Load : FirstUse::Store);
}

// The uses of a scope's own code: its statements, descending into if branches but not into the
// bodies that are scopes of their own.
void collect(const Body& body, Uses& uses, bool in_branch) {
  for (const auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::Print:
        note_loads(s->expr.get(), uses);
        break;
      case Stmt::Kind::If:
        for (size_t i = 0; i < s->branches.size(); ++i) {
          if (i < s->conditions.size()) note_loads(s->conditions[i].get(), uses);
          collect(s->branches[i], uses, true);
        }
        break;
      case Stmt::Kind::For:
        note_loads(s->expr.get(), uses);
        break;
      case Stmt::Kind::Set:
        note_loads(s->expr.get(), uses);
        note_store(s->target, uses, in_branch);
        break;
      case Stmt::Kind::SetBlock:
        note_loads(s->expr.get(), uses);
        note_store(s->target, uses, in_branch);
        break;
      case Stmt::Kind::Macro:
        note(uses, s->name, in_branch ? FirstUse::Load : FirstUse::Store);
        break;
      case Stmt::Kind::CallBlock:
      case Stmt::Kind::FilterBlock:
        note_loads(s->expr.get(), uses);
        break;
      case Stmt::Kind::With:
        for (const auto& v : s->values) note_loads(v.get(), uses);
        break;
      default:
        break;
    }
  }
}

bool declared_above(const std::string& name, const Ancestors& ancestors) {
  for (const Uses* a : ancestors)
    if (a->count(name) > 0) return true;
  return false;
}

std::vector<std::string> analyze_scope(Body& body, const Uses& prelude, const Ancestors& ancestors);

// Analyzes the scopes nested in a scope's own code (`uses` is that scope's).
void analyze_children(Body& body, const Uses& uses, const Ancestors& ancestors) {
  Ancestors inner = ancestors;
  inner.push_back(&uses);
  for (auto& s : body) {
    switch (s->kind) {
      case Stmt::Kind::If:
        for (auto& branch : s->branches) analyze_children(branch, uses, ancestors);
        break;
      case Stmt::Kind::For: {
        Uses prelude;
        note_store(s->target, prelude, false);
        note(prelude, "loop", FirstUse::Store);
        note_loads(s->condition.get(), prelude);
        s->undefined_at_entry = analyze_scope(s->body, prelude, inner);
        s->else_undefined_at_entry = analyze_scope(s->else_body, {}, inner);
        break;
      }
      case Stmt::Kind::Macro:
      case Stmt::Kind::CallBlock: {
        Uses prelude;
        for (const auto& p : s->params) note(prelude, p.name, FirstUse::Store);
        note(prelude, "caller", FirstUse::Store);
        for (const auto& p : s->params) note_loads(p.default_value.get(), prelude);
        s->undefined_at_entry = analyze_scope(s->body, prelude, inner);
        break;
      }
      case Stmt::Kind::With: {
        Uses prelude;
        for (const auto& t : s->targets) note_store(t, prelude, false);
        s->undefined_at_entry = analyze_scope(s->body, prelude, inner);
        break;
      }
      case Stmt::Kind::SetBlock:
      case Stmt::Kind::FilterBlock:
      case Stmt::Kind::Generation:
        s->undefined_at_entry = analyze_scope(s->body, {}, inner);
        break;
      default:
        break;
    }
  }
}

std::vector<std::string> analyze_scope(Body& body, const Uses& prelude, const Ancestors& ancestors) {
  Uses uses = prelude;
  collect(body, uses, false);
  std::vector<std::string> undefined;
  for (const auto& [name, first] : uses)
    if (first == FirstUse::Store && prelude.count(name) == 0 && !declared_above(name, ancestors)) undefined.push_back(name);
  analyze_children(body, uses, ancestors);
  return undefined;
}

}  // namespace

std::vector<std::string> analyze_scopes(Body& template_body) { return analyze_scope(template_body, {}, {}); }

}  // namespace hybridflow::text::jinja
