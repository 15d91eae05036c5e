#include "text/added_vocabulary.h"

#include <algorithm>

#include "text/regex.h"
#include "text/unicode.h"

namespace hybridflow::text {
namespace {

bool is_word_char(char32_t c) { return is_regex_word_char(c); }

char32_t last_char(std::string_view text) {
  size_t start = text.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
  size_t len;
  return decode_utf8(text, start, &len);
}

// Offset where the trailing whitespace of text[0, end) begins.
size_t trailing_space_start(std::string_view text, size_t end) {
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
    size_t len;
    if (!is_whitespace(decode_utf8(text, start, &len))) break;
    end = start;
  }
  return end;
}

// Offset where the leading whitespace of text[begin, ...) ends.
size_t leading_space_end(std::string_view text, size_t begin) {
  while (begin < text.size()) {
    size_t len;
    if (!is_whitespace(decode_utf8(text, begin, &len))) break;
    begin += len;
  }
  return begin;
}

}  // namespace

AddedTokenMatcher::AddedTokenMatcher(const std::vector<AddedToken>& tokens, const std::vector<std::string>& patterns) {
  for (size_t i = 0; i < tokens.size(); ++i)
    if (!patterns[i].empty()) entries_.push_back({patterns[i], &tokens[i]});
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Entry& a, const Entry& b) { return a.pattern.size() > b.pattern.size(); });
  by_first_.resize(256);
  for (size_t i = 0; i < entries_.size(); ++i)
    by_first_[static_cast<unsigned char>(entries_[i].pattern[0])].push_back(static_cast<uint32_t>(i));
}

std::vector<Segment> AddedTokenMatcher::split(std::string_view text) const {
  std::vector<Segment> segments;
  if (entries_.empty() || text.empty()) {
    segments.push_back({0, text.size(), -1});
    return segments;
  }
  size_t done = 0;  // end of the last segment emitted
  size_t pos = 0;
  while (pos < text.size()) {
    const Entry* hit = nullptr;
    for (uint32_t i : by_first_[static_cast<unsigned char>(text[pos])]) {
      const std::string& p = entries_[i].pattern;
      if (text.compare(pos, p.size(), p) == 0) {
        hit = &entries_[i];
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + hit->pattern.size();
    pos = stop;  // the search goes on after the match, whatever is kept of it
    const AddedToken& tok = *hit->token;
    if (tok.single_word) {
      const bool space_before = start == 0 || !is_word_char(last_char(text.substr(0, start)));
      size_t len;
      const bool space_after = stop == text.size() || !is_word_char(decode_utf8(text, stop, &len));
      if (!space_before || !space_after) continue;
    }
    if (tok.lstrip) start = std::max(trailing_space_start(text, start), done);
    if (tok.rstrip) stop = leading_space_end(text, stop);
    if (done < start) segments.push_back({done, start, -1});
    segments.push_back({start, stop, tok.id});
    done = stop;
  }
  if (done < text.size()) segments.push_back({done, text.size(), -1});
  return segments;
}

}  // namespace hybridflow::text
