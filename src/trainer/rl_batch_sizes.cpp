#include "rl_batch_sizes.h"

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"

namespace hybridflow {

int64_t mini_batch_rows_per_process(const ConfigReader& config, const std::string& key, int64_t n, int dp) {
  const int64_t prompts = config.get<int64_t>(key);
  HF_CHECK(prompts > 0, key, " must be > 0 prompts, got ", prompts);
  HF_CHECK((prompts * n) % dp == 0, key, " = ", prompts, " prompts x rollout.n = ", n, " = ", prompts * n,
           " samples do not divide across the role's ", dp, " data-parallel ranks");
  return prompts * n / dp;
}

int64_t micro_batch_rows_per_process(const ConfigReader& config, const std::string& key, int dp, int64_t fallback) {
  const std::string per_gpu = key + "_per_gpu";
  const bool global_set = !config.is_null(key);
  const bool local_set = !config.is_null(per_gpu);
  HF_CHECK(!(global_set && local_set), "set one of ", key, " (samples over all data-parallel ranks) = ",
           config.get<int64_t>(key), " and ", per_gpu, " (per process) = ", config.get<int64_t>(per_gpu),
           ", not both (as in verl)");
  if (local_set) {
    const int64_t rows = config.get<int64_t>(per_gpu);
    HF_CHECK(rows > 0, per_gpu, " must be > 0, got ", rows);
    return rows;
  }
  if (!global_set) return fallback;
  const int64_t rows = config.get<int64_t>(key);
  HF_CHECK(rows > 0, key, " must be > 0, got ", rows);
  HF_CHECK(rows % dp == 0, key, " = ", rows, " samples do not divide across the role's ", dp,
           " data-parallel ranks; set a multiple of ", dp, " or ", per_gpu);
  if (dp > 1)  // hybridflow's releases before verl's semantics read this key per process: say what it means now
    log_info(key, " = ", rows, " counts samples over all ", dp, " data-parallel ranks (verl's meaning): ", rows / dp,
             " per process; ", per_gpu, " sets it per process");
  return rows / dp;
}

DynamicBsz dynamic_bsz(const ConfigReader& config, const std::string& flag_key, bool inherited_flag,
                       const std::string& len_key, int64_t inherited_len) {
  DynamicBsz d;
  d.on = config.is_null(flag_key) ? inherited_flag : config.get<bool>(flag_key);
  d.max_tokens = config.is_null(len_key) ? inherited_len : config.get<int64_t>(len_key);
  HF_CHECK(!d.on || d.max_tokens > 0, len_key, " must be > 0 tokens per micro-batch when ", flag_key,
           " is on, got ", d.max_tokens);
  return d;
}

void check_micro_divides_mini(int64_t mini_rows, int64_t micro_rows, const std::string& mini_key,
                              const std::string& micro_key) {
  // A micro-batch larger than the mini-batch runs the whole mini-batch at once.
  HF_CHECK(micro_rows > mini_rows || mini_rows % micro_rows == 0, micro_key, " = ", micro_rows,
           " samples per process do not divide ", mini_key, "'s ", mini_rows, " samples per process");
}

}  // namespace hybridflow
