#include "text/byte_level.h"

#include "text/unicode.h"

namespace hybridflow::text {

ByteLevelAlphabet::ByteLevelAlphabet() {
  byte_of_.fill(-1);
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
    const char32_t cp = printable ? static_cast<char32_t>(b) : next++;
    std::string utf8;
    append_utf8(utf8, cp);
    Utf8Char& c = chars_[static_cast<size_t>(b)];
    c.size = utf8.size();
    for (size_t k = 0; k < utf8.size(); ++k) c.bytes[k] = utf8[k];
    byte_of_[cp] = b;
  }
}

const ByteLevelAlphabet& ByteLevelAlphabet::get() {
  static const ByteLevelAlphabet alphabet;
  return alphabet;
}

}  // namespace hybridflow::text
