#include "text/normalizers.h"

namespace hybridflow::text {

std::string replace_all(const std::string& text, const std::string& from, const std::string& to) {
  if (from.empty()) return text;
  size_t pos = text.find(from);
  if (pos == std::string::npos) return text;
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t prev = 0;
  while (pos != std::string::npos) {
    out.append(text, prev, pos - prev);
    out += to;
    prev = pos + from.size();
    pos = text.find(from, prev);
  }
  out.append(text, prev, std::string::npos);
  return out;
}

ReplaceNormalizer::ReplaceNormalizer(std::string literal, std::string content)
    : literal_(std::move(literal)), content_(std::move(content)) {}

ReplaceNormalizer::ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content)
    : regex_(std::move(regex)), content_(std::move(content)) {}

void ReplaceNormalizer::normalize(std::string& text) const {
  if (!regex_) {
    text = replace_all(text, literal_, content_);
    return;
  }
  std::vector<std::pair<size_t, size_t>> matches;
  regex_->find_all(text, matches);
  if (matches.empty()) return;
  std::string out;
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    out.append(text, prev, s - prev);
    out += content_;
    prev = e;
  }
  out.append(text, prev, std::string::npos);
  text = std::move(out);
}

void StripNormalizer::normalize(std::string& text) const {
  size_t begin = 0, end = text.size();
  if (left_) {
    while (begin < end) {
      size_t len;
      if (!is_whitespace(decode_utf8(text, begin, &len))) break;
      begin += len;
    }
  }
  if (right_) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(text[start]) & 0xc0) == 0x80) --start;
      size_t len;
      if (!is_whitespace(decode_utf8(text, start, &len))) break;
      end = start;
    }
  }
  text = text.substr(begin, end - begin);
}

}  // namespace hybridflow::text
