// Normalizers: rewrite a piece of text before it is split into words (Unicode normal forms, prefix
// insertion, replacements, case and whitespace).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "text/regex.h"
#include "text/unicode.h"

namespace hybridflow::text {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

class UnicodeNormalizer : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {}
  void normalize(std::string& text) const override { text = normalize_unicode(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override { text = to_lower(text); }
};

// Prepends a string to non-empty text (SentencePiece's "▁" before the first word).
class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

// Replaces every match of a literal string or of a regular expression.
class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::string literal, std::string content);            // a String pattern
  ReplaceNormalizer(std::unique_ptr<Regex> regex, std::string content);  // a Regex pattern
  void normalize(std::string& text) const override;

 private:
  std::string literal_;
  std::unique_ptr<Regex> regex_;
  std::string content_;
};

// Removes leading and/or trailing whitespace.
class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override;

 private:
  bool left_, right_;
};

// BERT's: control characters out and whitespace to spaces (clean_text), spaces around CJK
// ideographs, accents stripped (NFD, then nonspacing marks, Mn only, out), lowercase.
class BertNormalizer : public Normalizer {
 public:
  BertNormalizer(bool clean_text, bool handle_chinese_chars, bool strip_accents, bool lowercase)
      : clean_text_(clean_text), chinese_(handle_chinese_chars), strip_accents_(strip_accents), lowercase_(lowercase) {}
  void normalize(std::string& text) const override;

 private:
  bool clean_text_, chinese_, strip_accents_, lowercase_;
};

// Removes combining marks (categories Mn, Mc, Me); with NFD before it, accents.
class StripAccentsNormalizer : public Normalizer {
 public:
  void normalize(std::string& text) const override;
};

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& step : steps_) step->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// Replaces every occurrence of `from` (non-empty) in text by `to`, in one pass.
std::string replace_all(const std::string& text, const std::string& from, const std::string& to);

}  // namespace hybridflow::text
