// verl's trainer.balance_batch: which rows each data-parallel rank trains on. A data-parallel update waits
// for its slowest rank, and a rank's work follows the tokens of its rows: rows of a batch in order (a
// prompt's samples together, long answers clustered by prompt) can give one rank far more work than
// another. Balancing reorders the rows so that the protocol's equal chunks carry like amounts of work.
#pragma once

#include <cstdint>
#include <vector>

namespace hybridflow {

// The work of one sequence of `tokens` tokens through a transformer of hidden size `hidden_size`, up to a
// common factor: its projections and MLP grow as 12 h^2 L and its attention as 2 h L^2, so 6 h L + L^2
// (verl's estimate with h = 4096 is 24576 L + L^2; the model's own h weighs attention right at other sizes).
int64_t sequence_workload(int64_t tokens, int64_t hidden_size);

// Splits rows of `costs` (work each) into `parts` parts of costs.size() / parts rows each (the division must
// be exact) with near-equal cost sums, by Karmarkar and Karp's largest differencing method (as verl does):
// rows sorted by cost are dealt in runs of `parts`, one row to each part; the two partial partitions whose
// heaviest and lightest parts differ most are merged, heaviest part with lightest, until one is left.
// Returns the rows part after part, each part's rows in ascending order, so that chunk p of the result is
// part p. A function of the costs alone (ties go by row index).
std::vector<int64_t> balanced_row_order(const std::vector<int64_t>& costs, int64_t parts);

// The sums of `values` over the `parts` equal consecutive chunks of the rows taken in `order` (identity
// when empty).
std::vector<int64_t> chunk_token_sums(const std::vector<int64_t>& values, int64_t parts,
                                      const std::vector<int64_t>& order = {});

}  // namespace hybridflow
