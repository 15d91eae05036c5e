// Post-processors: add the special tokens around encoded sequences (BOS for Llama, [CLS]/[SEP] for
// BERT) when special tokens are asked for, and join a pair of sequences into one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace hybridflow::text {

// One encoding per input sequence (one, or two for a pair); a processor may join them.
using Encodings = std::vector<std::vector<int32_t>>;

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(Encodings& encodings, bool add_special_tokens) const = 0;
};

// ByteLevel only adjusts offsets, which hybridflow does not compute: ids pass unchanged.
class IdentityPostProcessor : public PostProcessor {
 public:
  void process(Encodings&, bool) const override {}
};

// A template such as "<s> $A" / "<s> $A <s> $B": sequences and special tokens in order.
class TemplatePostProcessor : public PostProcessor {
 public:
  struct Item {
    bool is_sequence;  // $A / $B, else a special token
    int sequence;      // 0 for A, 1 for B
    std::vector<int32_t> special_ids;
  };
  TemplatePostProcessor(std::vector<Item> single, std::vector<Item> pair)
      : single_(std::move(single)), pair_(std::move(pair)) {}
  void process(Encodings& encodings, bool add_special_tokens) const override;

 private:
  std::vector<Item> single_, pair_;
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> steps) : steps_(std::move(steps)) {}
  void process(Encodings& encodings, bool add_special_tokens) const override {
    for (const auto& step : steps_) step->process(encodings, add_special_tokens);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> steps_;
};

}  // namespace hybridflow::text
