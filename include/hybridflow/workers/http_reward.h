// Scores a batch with one HTTP POST to a scoring server (see reward_function.h for the JSON format).
// A minimal HTTP/1.1 client over POSIX sockets: plain http only, Content-Length or chunked replies.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hybridflow/workers/reward_function.h"

namespace hybridflow {

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string path = "/";
};
// "http://HOST[:PORT][/PATH]" (IPv6 hosts in brackets); anything else -> Error naming the url.
HttpUrl parse_http_url(const std::string& url);

struct HttpResponse {
  int status = 0;
  std::string body;
};
// One POST, Connection: close. timeout_s is one wall-clock deadline over connect, send and the whole
// reply (a server that keeps trickling bytes is cut off too); a body of more than max_body_bytes (or a
// head of more than 64 KiB) is an error, raised as soon as it is announced or read. Errors (refused,
// timeout, too large, malformed reply) name the url.
HttpResponse http_post(const HttpUrl& url, const std::string& content_type, const std::string& body,
                       double timeout_s, size_t max_body_bytes = size_t{16} << 20);

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
