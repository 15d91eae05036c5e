#include "hybridflow/core/printable.h"

namespace hybridflow {

std::string printable(std::string_view text, size_t max_chars) {
  static const char* hex = "0123456789abcdef";
  std::string out;
  const size_t n = text.size() < max_chars ? text.size() : max_chars;
  out.reserve(n + 8);
  for (size_t i = 0; i < n; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\x";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (text.size() > n) out += "...(" + std::to_string(text.size()) + " bytes)";
  return out;
}

}  // namespace hybridflow
