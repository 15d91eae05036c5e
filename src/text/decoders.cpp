#include "text/decoders.h"

#include "text/byte_level.h"
#include "text/normalizers.h"
#include "text/unicode.h"

namespace hybridflow::text {

void ByteLevelDecoder::decode(std::vector<std::string>& tokens) const {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::get();
  std::string bytes;
  for (const std::string& token : tokens) {
    const size_t mark = bytes.size();
    bool in_alphabet = true;
    size_t i = 0;
    while (i < token.size()) {
      size_t len;
      const int b = alphabet.byte_of(decode_utf8(token, i, &len));
      if (b < 0) {
        in_alphabet = false;
        break;
      }
      bytes += static_cast<char>(b);
      i += len;
    }
    if (!in_alphabet) {
      bytes.resize(mark);
      bytes += token;
    }
  }
  tokens.assign(1, utf8_lossy(bytes));
}

void ReplaceDecoder::decode(std::vector<std::string>& tokens) const {
  for (std::string& token : tokens) {
    if (!regex_) {
      token = replace_all(token, literal_, content_);
      continue;
    }
    std::vector<std::pair<size_t, size_t>> matches;
    regex_->find_all(token, matches);
    std::string out;
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      out.append(token, prev, s - prev);
      out += content_;
      prev = e;
    }
    out.append(token, prev, std::string::npos);
    token = std::move(out);
  }
}

namespace {

int byte_token_value(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int digit = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (digit < 0) return -1;
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace

void ByteFallbackDecoder::decode(std::vector<std::string>& tokens) const {
  std::vector<std::string> out;
  out.reserve(tokens.size());
  std::string pending;
  auto flush = [&] {
    if (pending.empty()) return;
    if (find_invalid_utf8(pending) == std::string::npos) {
      out.push_back(pending);
    } else {
      for (size_t i = 0; i < pending.size(); ++i) out.emplace_back("\xef\xbf\xbd");
    }
    pending.clear();
  };
  for (std::string& token : tokens) {
    const int b = byte_token_value(token);
    if (b >= 0) {
      pending += static_cast<char>(b);
      continue;
    }
    flush();
    out.push_back(std::move(token));
  }
  flush();
  tokens = std::move(out);
}

void FuseDecoder::decode(std::vector<std::string>& tokens) const {
  std::string all;
  for (const std::string& t : tokens) all += t;
  tokens.assign(1, std::move(all));
}

void StripDecoder::decode(std::vector<std::string>& tokens) const {
  if (content_.empty()) return;
  for (std::string& token : tokens) {
    size_t begin = 0, end = token.size();
    for (size_t k = 0; k < start_ && token.compare(begin, content_.size(), content_) == 0; ++k) begin += content_.size();
    for (size_t k = 0; k < stop_ && end >= begin + content_.size() &&
                       token.compare(end - content_.size(), content_.size(), content_) == 0;
         ++k)
      end -= content_.size();
    token = token.substr(begin, end - begin);
  }
}

void MetaspaceDecoder::decode(std::vector<std::string>& tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& token = tokens[i];
    if (i == 0 && strip_first_) {
      token = replace_all(token, replacement_, "");
    } else {
      token = replace_all(token, replacement_, " ");
    }
  }
}

void WordPieceDecoder::decode(std::vector<std::string>& tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string& token = tokens[i];
    if (i != 0) {
      if (token.compare(0, prefix_.size(), prefix_) == 0) {
        token.erase(0, prefix_.size());
      } else {
        token.insert(0, " ");
      }
    }
    if (cleanup_) {
      static const std::pair<const char*, const char*> kCleanup[] = {
          {" .", "."},    {" ?", "?"},     {" !", "!"},         {" ,", ","},      {" ' ", "'"},
          {" n't", "n't"}, {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
      for (const auto& [from, to] : kCleanup) token = replace_all(token, from, to);
    }
  }
}

}  // namespace hybridflow::text
