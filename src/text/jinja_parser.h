// Builds the statement tree of a template from jinja_lexer's tokens, with jinja2's grammar and
// operator precedence. Unknown tags, filters and tests fail here, naming the position.
#pragma once

#include <string>

#include "text/jinja_ast.h"

namespace hybridflow::text::jinja {

// Throws TemplateError (with line and column) on a syntax error or an unsupported construct.
Body parse_template(const std::string& source);

}  // namespace hybridflow::text::jinja
