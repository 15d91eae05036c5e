// An open-addressing hash map from a pair of token ids to its merge, for the BPE inner loop: one
// multiply and usually one probe per lookup, in a flat array (std::unordered_map's node chasing was a
// third of encode time on long words).
#pragma once

#include <cstdint>
#include <vector>

namespace hybridflow::text {

template <typename Value>
class PairMap {
 public:
  static uint64_t key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // Sized for `n` entries at most half full.
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots_.assign(capacity, Slot{kEmpty, Value{}});
    mask_ = capacity - 1;
    shift_ = 64;
    for (size_t c = capacity; c > 1; c >>= 1) --shift_;
  }

  // Keeps the first value inserted for a key. Call reserve() first with the final count.
  void insert(uint64_t k, const Value& v) {
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return;
      if (slots_[i].key == kEmpty) {
        slots_[i] = Slot{k, v};
        return;
      }
    }
  }

  const Value* find(uint64_t k) const {
    for (size_t i = slot_of(k);; i = (i + 1) & mask_) {
      if (slots_[i].key == k) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // no pair of non-negative int32 ids has this key
  struct Slot {
    uint64_t key;
    Value value;
  };
  size_t slot_of(uint64_t k) const { return static_cast<size_t>((k * 0x9E3779B97F4A7C15ull) >> shift_); }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  int shift_ = 64;
};

}  // namespace hybridflow::text
