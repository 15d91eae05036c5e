// jinja2 decides variable scopes when it compiles a template, not while it runs: a name assigned
// anywhere at the top level of a scope (the template, a for-loop body, a macro, a with block) is local
// to that scope from its start. Until the assignment runs, reading it (typically from a macro called
// earlier) gives Undefined, not the value of the same name in the render context or an outer loop,
// unless an enclosing scope also uses the name or the scope reads it before assigning it. This pass
// finds those names so the evaluator can start each scope with them Undefined. Assignments inside
// {% if %} branches never count (jinja2 then falls back to the outer value).
#pragma once

#include <string>
#include <vector>

#include "text/jinja_ast.h"

namespace hybridflow::text::jinja {

// Fills Stmt::undefined_at_entry / else_undefined_at_entry throughout, and returns the names the
// template's top-level scope starts with as Undefined.
std::vector<std::string> analyze_scopes(Body& template_body);

}  // namespace hybridflow::text::jinja
