// Text that came from outside (a peer's hostname, pool name, message kind, error text) made safe to
// print into a log: a newline or an escape sequence in it must not forge a log line or drive the
// terminal. One helper, so every log site escapes the same way.
#pragma once

#include <string>
#include <string_view>

namespace hybridflow {

// Printable ASCII is kept except the backslash (doubled); \n, \r, \t are written as such; every other
// byte (control characters, DEL, bytes >= 0x80) as \xNN. Longer than max_chars input bytes is cut and
// "...(N bytes)" appended, so a peer cannot flood a log line either.
std::string printable(std::string_view text, size_t max_chars = 200);

}  // namespace hybridflow
