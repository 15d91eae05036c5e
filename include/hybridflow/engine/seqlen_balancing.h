// verl's trainer.balance_batch: which rows each data-parallel rank trains on. A data-parallel update waits
// for its slowest rank, and a rank's work follows the tokens of its rows: rows of a batch in order (a
// prompt's samples together, long answers clustered by prompt) can give one rank far more tokens than
// another. Balancing reorders the rows so that the protocol's equal chunks carry like token counts.
#pragma once

#include <cstdint>
#include <vector>

namespace hybridflow {

// Splits rows of `lengths` (tokens each) into `parts` parts of lengths.size() / parts rows each (the
// division must be exact) with near-equal token sums: longest rows first, each to the part with the fewest
// tokens that still has room (a greedy where verl uses Karmarkar-Karp). Returns the rows part after part,
// each part's rows in ascending order, so that chunk p of the result is part p.
std::vector<int64_t> balanced_row_order(const std::vector<int64_t>& lengths, int64_t parts);

// The token sums of the `parts` equal consecutive chunks of `lengths` taken in `order` (identity when empty).
std::vector<int64_t> chunk_token_sums(const std::vector<int64_t>& lengths, int64_t parts,
                                      const std::vector<int64_t>& order = {});

}  // namespace hybridflow
