// A minimal HTTP/1.1 client over POSIX sockets for scoring servers and tool endpoints: one POST per
// connection, plain http only, Content-Length or chunked replies, bounded in time and in bytes.
#pragma once

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "hybridflow/core/error.h"

namespace hybridflow {

// What http_post throws: an Error whose kind says whether a bound stopped the request.
class HttpError : public Error {
 public:
  enum class Kind { failed, timed_out, too_large };
  HttpError(Kind kind, const std::string& what) : Error(what), kind_(kind) {}
  Kind kind() const { return kind_; }

 private:
  Kind kind_;
};

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string path = "/";
};
// "http://HOST[:PORT][/PATH]" (IPv6 hosts in brackets); anything else -> Error naming `key` and the url.
HttpUrl parse_http_url(const std::string& url, const std::string& key = "url");

struct HttpResponse {
  int status = 0;
  std::string body;
};

struct HttpPostOptions {
  double timeout_s = 30;
  size_t max_body_bytes = size_t{16} << 20;
  std::vector<std::pair<std::string, std::string>> headers;  // extra request headers (no CR/LF in them)
  // How errors name the caller and the config keys that set the bounds.
  std::string client = "http";
  std::string timeout_key = "timeout_s";
  std::string max_body_key = "max_output_bytes";
};

// One POST, Connection: close. timeout_s is one wall-clock deadline over connect, send and the whole
// reply (a server that keeps trickling bytes is cut off too); a body of more than max_body_bytes (or a
// head of more than 64 KiB) is an error, raised as soon as it is announced or read. Errors (refused,
// timeout, too large, malformed reply) name the url; all are HttpError.
HttpResponse http_post(const HttpUrl& url, const std::string& content_type, const std::string& body,
                       const HttpPostOptions& options);

}  // namespace hybridflow
