// Splitting a piece of text around the matches of a pattern, with the tokenizers library's
// SplitDelimiterBehavior: what happens to the matched delimiters.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace hybridflow::text {

// A piece of text on its way to the model. `at_input_start`: the piece begins at offset 0 of the
// original input (Metaspace's prepend_scheme "first" depends on it).
struct Piece {
  std::string text;
  bool at_input_start = false;
};

enum class SplitBehavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

// [start, end) and whether it is a match of the pattern; together the spans cover the piece.
struct Span {
  size_t start, end;
  bool is_match;
};

// The spans of `text` around the given matches (sorted, non-overlapping).
std::vector<Span> spans_around(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches);

// Applies the behavior (after swapping matches and non-matches when `invert`) and appends the
// resulting non-empty pieces of `piece` to `out`.
void split_piece(const Piece& piece, std::vector<Span> spans, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out);

}  // namespace hybridflow::text
