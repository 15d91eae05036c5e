// Hand-written matchers for the word patterns most byte-level tokenizers use (GPT-2's, and the
// Llama-3 / Qwen2 one with \p{N}{1,3} or \p{N}), which give the matches Oniguruma gives for those
// exact patterns several times faster. Letters, numbers and whitespace are Oniguruma's own Unicode
// classes; the one case decided differently from ASCII (a case-insensitive contraction whose letter
// is not ASCII) is left to the regex engine. The tests compare the end result with the reference.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hybridflow::text {

class WordScanner {
 public:
  // A scanner for `pattern`, or null when the pattern is not one of the known ones.
  static std::unique_ptr<WordScanner> for_pattern(const std::string& pattern);

  // Appends the matches in `text` and returns true, or returns false (appending nothing) when the
  // regex engine must decide.
  bool find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  enum class Kind { Gpt2, Llama3 };
  WordScanner(Kind kind, int max_digits) : kind_(kind), max_digits_(max_digits) {}
  Kind kind_;
  int max_digits_;  // Llama-3: 3 (\p{N}{1,3}); Qwen2: 1 (\p{N}); GPT-2: unbounded (\p{N}+)
};

}  // namespace hybridflow::text
