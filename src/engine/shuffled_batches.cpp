#include "hybridflow/engine/shuffled_batches.h"

#include <algorithm>
#include <numeric>

#include "hybridflow/core/error.h"

namespace hybridflow {

ShuffledBatches::ShuffledBatches(int64_t rows, int64_t batch_size, uint64_t seed)
    : order_(static_cast<size_t>(std::max<int64_t>(rows, 0))),
      batch_size_(std::min(batch_size, rows)),
      cursor_(order_.size()),  // forces a shuffle before the first batch
      rng_(seed) {
  HF_CHECK(rows > 0, "shuffled batches: the training data has no rows");
  HF_CHECK(batch_size > 0, "shuffled batches: batch_size is ", batch_size, ", expected > 0");
  std::iota(order_.begin(), order_.end(), 0);
}

std::vector<int64_t> ShuffledBatches::next() {
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(batch_size_));
  while (static_cast<int64_t>(rows.size()) < batch_size_) {
    if (cursor_ >= order_.size()) {
      std::shuffle(order_.begin(), order_.end(), rng_);
      cursor_ = 0;
    }
    rows.push_back(order_[cursor_++]);
  }
  return rows;
}

void ShuffledBatches::skip(int64_t batches) {
  for (int64_t b = 0; b < batches; ++b) next();
}

}  // namespace hybridflow
