// Internal to trainer/: verl's batch-size keys as rows per process. verl's semantics: ppo_mini_batch_size
// counts prompts over all data-parallel ranks (x rollout.n samples); a micro-batch key `<name>` counts samples
// over all ranks and `<name>_per_gpu` samples per process (one of the two, never both).
#pragma once

#include <cstdint>
#include <string>

#include "config_reader.h"

namespace hybridflow {

// Samples per process per optimizer step of the role whose ppo_mini_batch_size is `key`, over `dp` ranks.
int64_t mini_batch_rows_per_process(const ConfigReader& config, const std::string& key, int64_t n, int dp);

// Samples per process per forward (and backward) from `key` (global) or `key`_per_gpu; `fallback` when
// both are null. Errors name both keys and numbers.
int64_t micro_batch_rows_per_process(const ConfigReader& config, const std::string& key, int dp, int64_t fallback);

// verl's dynamic batch size: a pass's token budget per micro-batch (its *_max_token_len_per_gpu) when its
// use_dynamic_bsz switch is on, else 0 (micro-batches of rows). A null switch or length inherits
// `inherited_flag` / `inherited_len`, as verl's interpolations (${actor_rollout_ref.actor.use_dynamic_bsz}, ...)
// do. A budget that is on must be > 0; the error names the key.
struct DynamicBsz {
  bool on = false;
  int64_t max_tokens = 0;  // the length key's value, even when off (passes that inherit it read it)
  int64_t budget() const { return on ? max_tokens : 0; }
};
DynamicBsz dynamic_bsz(const ConfigReader& config, const std::string& flag_key, bool inherited_flag,
                       const std::string& len_key, int64_t inherited_len);

// A micro-batch must split the mini-batch evenly (verl asserts the same); the error names both keys.
void check_micro_divides_mini(int64_t mini_rows, int64_t micro_rows, const std::string& mini_key,
                              const std::string& micro_key);

}  // namespace hybridflow
