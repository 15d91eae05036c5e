#include "hybridflow/report/html_escape.h"

namespace hybridflow::report {

std::string html_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20 && c != '\n' && c != '\t') {
          out += "\xEF\xBF\xBD";  // U+FFFD
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

}  // namespace hybridflow::report
