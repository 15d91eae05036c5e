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

  // Appends the alphabet's characters for each byte of `bytes`.
  void encode(std::string_view bytes, std::string& out) const {
    for (char b : bytes) out += chars_[static_cast<unsigned char>(b)];
  }
  // The byte a code point stands for, or -1 when it is not in the alphabet.
  int byte_of(char32_t c) const { return c < byte_of_.size() ? byte_of_[c] : -1; }

 private:
  ByteLevelAlphabet();
  std::array<std::string, 256> chars_;
  std::array<int, 324> byte_of_{};  // code points of the alphabet are all below 0x144
};

}  // namespace hybridflow::text
