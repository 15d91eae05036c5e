// A tool served over HTTP: each call POSTs the arguments as a JSON object to the url and the reply body
// (status 200) is the result. One deadline over the whole request and a byte limit on the reply, as the
// HTTP reward. The row's tools_kwargs entry for the tool (if any) is sent as the X-HF-Tool-Kwargs header
// (JSON, ASCII). The host must be loopback or listed in allowed_hosts.
#pragma once

#include <string>
#include <vector>

#include "hybridflow/agent/command_tool.h"
#include "hybridflow/agent/tool.h"
#include "hybridflow/core/http_client.h"

namespace hybridflow::agent {

// A url that tools and interactions POST JSON to, with the bounds of each request. Its host must be
// loopback or in allowed_hosts; errors name `where` and config.url / timeout_s / max_output_bytes.
class HttpEndpoint {
 public:
  HttpEndpoint(const std::string& url, ProcessBounds bounds, const std::vector<std::string>& allowed_hosts,
               const std::string& where);
  // Throws HttpError (naming `client`) when the request fails or a bound stops it.
  HttpResponse post_json(const std::string& body, const std::string& client,
                         std::vector<std::pair<std::string, std::string>> headers = {}) const;
  std::string describe() const { return "http '" + text_ + "'"; }

 private:
  std::string text_;
  HttpUrl url_;
  ProcessBounds bounds_;
};

class HttpTool : public Tool {
 public:
  HttpTool(Json schema, const std::string& url, ProcessBounds bounds, const std::vector<std::string>& allowed_hosts,
           const std::string& where);
  std::string describe() const override;

 protected:
  ToolResult run(const Json& arguments, const Json& kwargs) const override;

 private:
  HttpEndpoint endpoint_;
};

// Throws unless the url's host is loopback or in allowed_hosts (`where` and `key` name the setting).
void check_http_host_allowed(const HttpUrl& url, const std::vector<std::string>& allowed_hosts,
                             const std::string& where, const std::string& key);

}  // namespace hybridflow::agent
