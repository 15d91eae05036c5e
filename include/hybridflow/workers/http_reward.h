// Scores a batch with one HTTP POST to a scoring server (see reward_function.h for the JSON format).
// The HTTP client is core/http_client.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/core/http_client.h"
#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

class HttpReward : public RewardFunction {
 public:
  // The url's host must be loopback or listed in allowed_hosts (scores must not leak data by accident).
  // Replies with a body of more than max_output_bytes are an error (reward.max_output_bytes).
  HttpReward(const std::string& url, double timeout_s, const std::vector<std::string>& allowed_hosts = {},
             int64_t max_output_bytes = kDefaultRewardMaxOutputBytes);

  std::vector<double> score(const std::vector<RewardRequest>& batch) override;
  std::string describe() const override;

 private:
  std::string url_text_;
  HttpUrl url_;
  double timeout_s_;
  int64_t max_output_bytes_;
};

}  // namespace hybridflow
