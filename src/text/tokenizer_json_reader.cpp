#include "text/tokenizer_json_reader.h"

#include <algorithm>
#include <cstdint>

namespace hybridflow::text {
namespace {

using json = nlohmann::json;

// nlohmann's SAX events. Outside the large parts it builds the tree as json::parse does (a repeated
// key keeps its last value); inside them it fills the vocab or the merges. A handler returning false
// stops the parse: the form is not the regular one.
class TokenizerPartsHandler {
 public:
  explicit TokenizerPartsHandler(TokenizerJsonParts& out) : out_(out) {}

  bool null() { return mode_ == Mode::Tree && value(nullptr); }
  bool boolean(bool v) { return mode_ == Mode::Tree && value(v); }
  bool number_integer(json::number_integer_t v) { return mode_ == Mode::Tree && value(v); }
  bool number_unsigned(json::number_unsigned_t v) {
    if (mode_ == Mode::Vocab) return vocab_entry(v);
    return mode_ == Mode::Tree && value(v);
  }
  bool number_float(json::number_float_t v, const json::string_t& /*text*/) {
    return mode_ == Mode::Tree && value(v);
  }
  bool binary(json::binary_t& v) { return mode_ == Mode::Tree && value(std::move(v)); }  // not in JSON text

  bool string(json::string_t& s) {
    switch (mode_) {
      case Mode::Tree:
        return value(std::move(s));
      case Mode::Merges: {  // "a b": exactly one space
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) return false;
        out_.merges->emplace_back(s.substr(0, space), s.substr(space + 1));
        return true;
      }
      case Mode::MergePair:
        if (pair_size_ == 2) return false;
        pair_[pair_size_++] = std::move(s);
        return true;
      case Mode::Vocab:
        return false;
    }
    return false;
  }

  bool key(json::string_t& k) {
    if (mode_ == Mode::Vocab) {
      vocab_key_ = std::move(k);
      return true;
    }
    // Either large part, or the model holding them, seen twice would leave the tree and the parts
    // disagreeing on which one counts.
    next_ = Part::None;
    if (stack_.size() == 1) {
      next_is_model_ = k == "model";
      if (next_is_model_ && std::exchange(seen_model_, true)) return false;
    } else if (stack_.size() == 2 && in_model_) {
      if (k == "vocab") {
        if (std::exchange(seen_vocab_, true)) return false;
        next_ = Part::Vocab;
      } else if (k == "merges") {
        if (std::exchange(seen_merges_, true)) return false;
        next_ = Part::Merges;
      }
    }
    slot_ = &(*stack_.back())[std::move(k)];
    return true;
  }

  bool start_object(std::size_t /*elements*/) {
    if (mode_ != Mode::Tree) return false;
    if (next_ == Part::Vocab) {
      value(json::value_t::object);
      out_.vocab.emplace();
      mode_ = Mode::Vocab;
      return true;
    }
    const bool entering_model = stack_.size() == 1 && next_is_model_;
    value(json::value_t::object);
    stack_.push_back(last_);
    in_model_ = in_model_ || entering_model;
    return true;
  }

  bool end_object() {
    if (mode_ == Mode::Vocab) {
      mode_ = Mode::Tree;
      return vocab_ids_regular();
    }
    stack_.pop_back();
    if (stack_.size() == 1) in_model_ = false;
    return true;
  }

  bool start_array(std::size_t /*elements*/) {
    if (mode_ == Mode::Merges) {
      mode_ = Mode::MergePair;
      pair_size_ = 0;
      return true;
    }
    if (mode_ != Mode::Tree) return false;
    if (next_ == Part::Merges) {
      value(json::value_t::array);
      out_.merges.emplace();
      mode_ = Mode::Merges;
      return true;
    }
    value(json::value_t::array);
    stack_.push_back(last_);
    return true;
  }

  bool end_array() {
    if (mode_ == Mode::MergePair) {
      if (pair_size_ != 2) return false;
      out_.merges->emplace_back(std::move(pair_[0]), std::move(pair_[1]));
      mode_ = Mode::Merges;
      return true;
    }
    if (mode_ == Mode::Merges) {
      mode_ = Mode::Tree;
      return true;
    }
    stack_.pop_back();
    return true;
  }

  // Throws what json::parse throws, so that the message is the same.
  template <class Exception>
  bool parse_error(std::size_t /*position*/, const std::string& /*last_token*/, const Exception& ex) {
    throw ex;
  }

 private:
  enum class Mode { Tree, Vocab, Merges, MergePair };
  enum class Part { None, Vocab, Merges };

  // A value in the tree: the document itself, an array's next element or the last key's value.
  template <class Value>
  bool value(Value&& v) {
    next_ = Part::None;
    if (stack_.empty()) {
      out_.rest = json(std::forward<Value>(v));
      last_ = &out_.rest;
    } else if (stack_.back()->is_array()) {
      stack_.back()->emplace_back(std::forward<Value>(v));
      last_ = &stack_.back()->back();
    } else {
      *slot_ = json(std::forward<Value>(v));
      last_ = slot_;
    }
    return true;
  }

  bool vocab_entry(json::number_unsigned_t id) {
    if (id > static_cast<json::number_unsigned_t>(INT32_MAX)) return false;
    if (!out_.vocab->emplace(std::move(vocab_key_), static_cast<int32_t>(id)).second) return false;
    vocab_ids_.push_back(static_cast<int32_t>(id));
    max_id_ = std::max(max_id_, static_cast<int64_t>(id));
    return true;
  }

  // Ids in range (the tree reader's bound: gaps are fine, millions are not) and distinct. With a
  // repeated id, which token an id maps back to depends on the vocab's iteration order, which only
  // the tree reader reproduces.
  bool vocab_ids_regular() const {
    const auto size = static_cast<int64_t>(out_.vocab->size());
    if (max_id_ >= size + (int64_t{1} << 20)) return false;
    std::vector<bool> seen(static_cast<size_t>(max_id_ + 1), false);
    for (const int32_t id : vocab_ids_) {
      if (seen[static_cast<size_t>(id)]) return false;
      seen[static_cast<size_t>(id)] = true;
    }
    return true;
  }

  TokenizerJsonParts& out_;
  Mode mode_ = Mode::Tree;
  std::vector<json*> stack_;  // the open objects and arrays of the tree
  json* slot_ = nullptr;      // where the value of the last key goes
  json* last_ = nullptr;      // the value added last
  Part next_ = Part::None;    // the large part the next value is
  bool next_is_model_ = false, in_model_ = false;
  bool seen_model_ = false, seen_vocab_ = false, seen_merges_ = false;
  std::string vocab_key_;
  std::vector<int32_t> vocab_ids_;  // in the file's order (a flat copy to check, cheaper than the map's nodes)
  int64_t max_id_ = -1;
  std::string pair_[2];
  size_t pair_size_ = 0;
};

}  // namespace

std::optional<TokenizerJsonParts> read_tokenizer_json_parts(const std::string& text) {
  TokenizerJsonParts parts;
  TokenizerPartsHandler handler(parts);
  if (!json::sax_parse(text, &handler)) return std::nullopt;
  return parts;
}

}  // namespace hybridflow::text
