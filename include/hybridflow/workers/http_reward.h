// Scores a batch with one HTTP POST to a scoring server (see reward_function.h for the JSON format).
// A minimal HTTP/1.1 client over POSIX sockets: plain http only, Content-Length or chunked replies.
#pragma once

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
// One POST, Connection: close. Errors (refused, timeout, malformed reply) name host:port.
HttpResponse http_post(const HttpUrl& url, const std::string& content_type, const std::string& body,
                       double timeout_s);

class HttpReward : public RewardFunction {
 public:
  // The url's host must be loopback or listed in allowed_hosts (scores must not leak data by accident).
  HttpReward(const std::string& url, double timeout_s, const std::vector<std::string>& allowed_hosts = {});

  std::vector<double> score(const std::vector<RewardRequest>& batch) override;
  std::string describe() const override;

 private:
  std::string url_text_;
  HttpUrl url_;
  double timeout_s_;
};

}  // namespace hybridflow
