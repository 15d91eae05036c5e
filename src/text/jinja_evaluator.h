// Executes a parsed template: statements write to the output, expressions evaluate to Values, and
// variables live in nested scopes with jinja2's rules (a `for` iteration, macro call, `with` block or
// `{% generation %}` body is a new scope; `if` is not; namespace attributes are how a loop body
// changes something outside it).
#pragma once

#include <string>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

// Throws TemplateError at the position of the failing statement or expression.
std::string render_template(const Body& body, const Dict& context);

}  // namespace hybridflow::text::jinja
