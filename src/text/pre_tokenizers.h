// Pre-tokenizers: split normalized text into the words the model tokenizes one by one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"
#include "text/split.h"

namespace hybridflow::text {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `pieces` by their sub-pieces.
  virtual void pre_tokenize(std::vector<Piece>& pieces) const = 0;
};

// GPT-2's: optionally a leading space, optionally GPT-2's word regex, then each byte as its
// byte-level character.
class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex);
  void pre_tokenize(std::vector<Piece>& pieces) const override;

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

// Splits on a literal string or a regular expression.
class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> regex, SplitBehavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override;

 private:
  std::unique_ptr<Regex> regex_;
  SplitBehavior behavior_;
  bool invert_;
};

// Splits where a character predicate holds, each such character being its own match.
class CharSplitPreTokenizer : public PreTokenizer {
 public:
  enum class Kind { Whitespace, Punctuation, Digits };
  CharSplitPreTokenizer(Kind kind, SplitBehavior behavior) : kind_(kind), behavior_(behavior) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override;

 private:
  Kind kind_;
  SplitBehavior behavior_;
};

enum class PrependScheme { First, Always, Never };

// SentencePiece's: spaces become `replacement` ("▁"), which is prepended per the scheme; with
// `split`, each word starts at a replacement character.
class MetaspacePreTokenizer : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override;

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::vector<Piece>& pieces) const override {
    for (const auto& step : steps_) step->pre_tokenize(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// GPT-2's word pattern, which ByteLevel uses when use_regex is true.
extern const char* const kGpt2WordPattern;
// The Whitespace pre-tokenizer's pattern: runs of word characters or of other non-space characters.
extern const char* const kWhitespaceWordPattern;

}  // namespace hybridflow::text
