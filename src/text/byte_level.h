// GPT-2's byte-level alphabet: every byte is shown as a printable code point (printable ASCII and
// Latin-1 bytes as themselves, the others as U+0100 onwards), so that a BPE vocabulary of such
// characters covers any byte string.
#pragma once

#include <array>
#include <string>
#include <string_view>

namespace hybridflow::text {

class ByteLevelAlphabet {
 public:
  static const ByteLevelAlphabet& get();

  // Appends the alphabet's characters for each byte of `bytes` (each one or two UTF-8 bytes, written
  // directly: appending them as strings cost a memmove call per byte).
  void encode(std::string_view bytes, std::string& out) const {
    size_t n = out.size();
    out.resize(n + 2 * bytes.size());
    for (char b : bytes) {
      const Utf8Char& c = chars_[static_cast<unsigned char>(b)];
      out[n++] = c.bytes[0];
      if (c.size == 2) out[n++] = c.bytes[1];
    }
    out.resize(n);
  }
  // The byte a code point stands for, or -1 when it is not in the alphabet.
  int byte_of(char32_t c) const { return c < byte_of_.size() ? byte_of_[c] : -1; }

 private:
  ByteLevelAlphabet();
  struct Utf8Char {
    char bytes[2];
    size_t size;
  };
  std::array<Utf8Char, 256> chars_{};  // every code point of the alphabet is below U+0800: two bytes at most
  std::array<int, 324> byte_of_{};  // code points of the alphabet are all below 0x144
};

}  // namespace hybridflow::text
