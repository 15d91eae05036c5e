// Executes a parsed template: statements write to the output, expressions evaluate to Values, and
// variables live in nested scopes with jinja2's rules (a `for` iteration, macro call, `with` block or
// `{% generation %}` body is a new scope; `if` is not; namespace attributes are how a loop body
// changes something outside it).
#pragma once

#include <string>
#include <vector>

#include "text/jinja_ast.h"
#include "text/jinja_value.h"

namespace hybridflow::text::jinja {

// `undefined_at_entry` is what analyze_scopes returned for `body`. Throws TemplateError at the
// position of the failing statement or expression.
std::string render_template(const Body& body, const std::vector<std::string>& undefined_at_entry,
                            const Dict& context);

}  // namespace hybridflow::text::jinja
