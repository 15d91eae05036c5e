// Escaping text for HTML and SVG (XML) content and attribute values: prompts and responses in a report are
// model output and must never become markup.
#pragma once

#include <string>
#include <string_view>

namespace hybridflow::report {

// & < > " ' as character references. Invalid UTF-8 is kept byte for byte (the page declares UTF-8, and a
// browser shows a replacement character); control characters other than tab and newline become U+FFFD,
// because XML forbids them.
std::string html_escape(std::string_view text);

}  // namespace hybridflow::report
