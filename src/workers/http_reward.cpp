#include "hybridflow/workers/http_reward.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow {

HttpReward::HttpReward(const std::string& url, double timeout_s, const std::vector<std::string>& allowed_hosts,
                       int64_t max_output_bytes)
    : url_text_(url), url_(parse_http_url(url, "reward.url")), timeout_s_(timeout_s), max_output_bytes_(max_output_bytes) {
  HF_CHECK(timeout_s_ > 0, "reward.timeout_s: expected > 0, got ", timeout_s_);
  HF_CHECK(max_output_bytes_ > 0, "reward.max_output_bytes: expected > 0, got ", max_output_bytes_);
  const std::vector<std::string> loopback = {"127.0.0.1", "localhost", "::1"};
  bool allowed = std::find(loopback.begin(), loopback.end(), url_.host) != loopback.end() ||
                 std::find(allowed_hosts.begin(), allowed_hosts.end(), url_.host) != allowed_hosts.end();
  HF_CHECK(allowed, "reward.url: host '", url_.host, "' is not loopback; add it to reward.allowed_hosts to send ",
           "prompts and responses there");
}

std::string HttpReward::describe() const { return "http '" + url_text_ + "'"; }

std::vector<double> HttpReward::score(const std::vector<RewardRequest>& batch) {
  if (batch.empty()) return {};
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& request : batch) rows.push_back(reward_request_to_json(request));
  nlohmann::json payload = {{"batch", std::move(rows)}};
  HttpResponse reply =
      http_post(url_, "application/json", payload.dump(),
                {.timeout_s = timeout_s_, .max_body_bytes = static_cast<size_t>(max_output_bytes_), .headers = {},
                 .client = "http reward", .timeout_key = "reward.timeout_s", .max_body_key = "reward.max_output_bytes"});
  auto snippet = [&] { return reply.body.size() <= 300 ? reply.body : reply.body.substr(0, 300) + "..."; };
  HF_CHECK(reply.status == 200, describe(), " answered HTTP ", reply.status, ": ", snippet());
  nlohmann::json parsed;
  try {
    parsed = nlohmann::json::parse(reply.body);
  } catch (const nlohmann::json::parse_error& e) {
    HF_FAIL(describe(), ": reply is not JSON (", e.what(), "): ", snippet());
  }
  HF_CHECK(parsed.is_object() && parsed.contains("scores") && parsed["scores"].is_array(), describe(),
           ": expected {\"scores\": [...]}, got ", snippet());
  const auto& scores = parsed["scores"];
  HF_CHECK(scores.size() == batch.size(), describe(), ": got ", scores.size(), " scores for a batch of ",
           batch.size());
  std::vector<double> out;
  out.reserve(scores.size());
  for (size_t i = 0; i < scores.size(); ++i) {
    HF_CHECK(scores[i].is_number(), describe(), ": scores[", i, "] is not a number: ", scores[i].dump());
    out.push_back(scores[i].get<double>());
  }
  return out;
}

}  // namespace hybridflow
