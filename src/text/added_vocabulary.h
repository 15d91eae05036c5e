// Added tokens (special or not): found in the input before the model sees it, longest match first,
// and kept whole. Tokens with normalized=false are matched in the raw input, the others in the
// normalized text; lstrip/rstrip take the whitespace beside a match into it, single_word requires
// the match not to touch word characters.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace hybridflow::text {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = false;
  // What id_to_token gives: the content, normalized when `normalized` (as the reference reports it).
  std::string token_text;
};

// A stretch of input: an added token's id, or -1 for text that still goes through the pipeline.
struct Segment {
  size_t start, end;
  int32_t token_id;
};

// Finds the occurrences of a set of strings, leftmost first and the longest of those starting there.
class AddedTokenMatcher {
 public:
  // `patterns[i]` is the text to find for `tokens[i]`.
  AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns);
  // Splits text into segments per the reference's rules.
  std::vector<Segment> split(std::string_view text) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  std::vector<Entry> entries_;                   // longest pattern first
  std::vector<std::vector<uint32_t>> by_first_;  // entry indices per first byte, longest first
};

}  // namespace hybridflow::text
