#include "text/split.h"

#include <algorithm>

namespace hybridflow::text {

std::vector<Span> spans_around(std::string_view text, const std::vector<std::pair<size_t, size_t>>& matches) {
  std::vector<Span> spans;
  if (text.empty()) return {{0, 0, false}};
  spans.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev != s) spans.push_back({prev, s, false});
    spans.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size()) spans.push_back({prev, text.size(), false});
  return spans;
}

void split_piece(const Piece& piece, std::vector<Span> spans, SplitBehavior behavior, bool invert,
                 std::vector<Piece>& out) {
  if (invert)
    for (Span& s : spans) s.is_match = !s.is_match;
  // The pieces to keep, as [start, end) spans (Removed drops the matches; the others merge spans).
  std::vector<Span> kept;
  kept.reserve(spans.size());
  switch (behavior) {
    case SplitBehavior::Isolated:
      kept = std::move(spans);
      for (Span& s : kept) s.is_match = false;
      break;
    case SplitBehavior::Removed:
      for (const Span& s : spans)
        if (!s.is_match) kept.push_back(s);
      break;
    case SplitBehavior::Contiguous: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match == previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.start, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithPrevious: {
      bool previous_match = false;
      for (const Span& s : spans) {
        if (s.is_match && !previous_match && !kept.empty()) {
          kept.back().end = s.end;
        } else {
          kept.push_back({s.start, s.end, false});
        }
        previous_match = s.is_match;
      }
      break;
    }
    case SplitBehavior::MergedWithNext: {
      bool previous_match = false;
      for (auto it = spans.rbegin(); it != spans.rend(); ++it) {
        if (it->is_match && !previous_match && !kept.empty()) {
          kept.back().start = it->start;
        } else {
          kept.push_back({it->start, it->end, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    }
  }
  for (const Span& s : kept) {
    if (s.end <= s.start) continue;
    out.push_back({piece.text.substr(s.start, s.end - s.start), piece.at_input_start && s.start == 0});
  }
}

}  // namespace hybridflow::text
