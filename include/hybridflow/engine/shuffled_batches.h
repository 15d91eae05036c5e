// The row order of the fine-tuning loops (SFT, reward model): batches of min(batch_size, rows) row
// indices drawn from a seeded permutation, reshuffled whenever every row has been served, so each pass
// sees each row once and a batch may straddle two passes.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace hybridflow {

class ShuffledBatches {
 public:
  ShuffledBatches(int64_t rows, int64_t batch_size, uint64_t seed);
  std::vector<int64_t> next();
  // Serves `batches` batches unseen: where a run resumed after that many steps continues the order it had.
  void skip(int64_t batches);

 private:
  std::vector<int64_t> order_;
  int64_t batch_size_;
  size_t cursor_;
  std::mt19937_64 rng_;
};

}  // namespace hybridflow
