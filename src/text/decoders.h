// Decoders: turn the tokens of ids back into text, each step rewriting the list of token strings.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"

namespace hybridflow::text {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode(std::vector<std::string>& tokens) const = 0;
};

// Byte-level characters back to bytes, then to text (invalid UTF-8 becomes U+FFFD). A token with a
// character outside the alphabet (an added token such as "<|eot_id|>" is fine) passes as its bytes.
class ByteLevelDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override;
};

// Replaces a literal or a regular expression in each token.
class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string literal, std::string content) : literal_(std::move(literal)), content_(std::move(content)) {}
  ReplaceDecoder(std::unique_ptr<Regex> regex, std::string content)
      : regex_(std::move(regex)), content_(std::move(content)) {}
  void decode(std::vector<std::string>& tokens) const override;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// Runs of <0xNN> tokens become the text of their bytes (one U+FFFD per byte when not valid UTF-8).
class ByteFallbackDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override;
};

// All tokens into one.
class FuseDecoder : public Decoder {
 public:
  void decode(std::vector<std::string>& tokens) const override;
};

// Removes up to `start` leading and `stop` trailing copies of a character from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode(std::vector<std::string>& tokens) const override;

 private:
  std::string content_;
  size_t start_, stop_;
};

// SentencePiece's "▁" back to spaces; the first token loses its prepended one.
class MetaspaceDecoder : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool strip_first)
      : replacement_(std::move(replacement)), strip_first_(strip_first) {}
  void decode(std::vector<std::string>& tokens) const override;

 private:
  std::string replacement_;
  bool strip_first_;
};

// BERT's: "##" continues a word, other tokens start a new one after a space.
class WordPieceDecoder : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode(std::vector<std::string>& tokens) const override;

 private:
  std::string prefix_;
  bool cleanup_;
};

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode(std::vector<std::string>& tokens) const override {
    for (const auto& step : steps_) step->decode(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

}  // namespace hybridflow::text
