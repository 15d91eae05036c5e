// Oniguruma regular expressions, configured as the tokenizers library configures them (UTF-8, the
// default syntax), so that patterns such as Llama-3's split text exactly as the reference does.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/word_scanner.h"

namespace hybridflow::text {

class Regex {
 public:
  // Throws hybridflow::Error with Oniguruma's message when the pattern does not compile. A known
  // word pattern (GPT-2's, Llama-3's, Qwen2's) is matched by a WordScanner unless `use_scanner` is
  // false (which tests use to compare the two).
  explicit Regex(const std::string& pattern, bool use_scanner = true);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Appends the byte ranges [start, end) of the successive matches in text. Like the reference's
  // iteration, an empty match right where the previous match ended is skipped, and lookarounds see
  // the whole text.
  void find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  // A pattern that matches `literal` exactly, escaped as the reference escapes literal patterns.
  static std::string escape(std::string_view literal);

 private:
  void* regex_ = nullptr;  // OnigRegex (kept opaque so that users need not include oniguruma.h)
  std::unique_ptr<WordScanner> scanner_;
};

// A word character as the Rust regex crate's \w has it (Alphabetic, marks, decimal digits, connector
// punctuation, Join_Control), which the reference uses for added tokens' single_word; from
// Oniguruma's Unicode tables.
bool is_regex_word_char(char32_t c);

}  // namespace hybridflow::text
