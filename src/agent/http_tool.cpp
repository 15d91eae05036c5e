#include "hybridflow/agent/http_tool.h"

#include <algorithm>

#include "hybridflow/core/error.h"

namespace hybridflow::agent {

void check_http_host_allowed(const HttpUrl& url, const std::vector<std::string>& allowed_hosts,
                             const std::string& where, const std::string& key) {
  const std::vector<std::string> loopback = {"127.0.0.1", "localhost", "::1"};
  bool allowed = std::find(loopback.begin(), loopback.end(), url.host) != loopback.end() ||
                 std::find(allowed_hosts.begin(), allowed_hosts.end(), url.host) != allowed_hosts.end();
  HF_CHECK(allowed, where, ": ", key, ": host '", url.host, "' is not loopback; list it in ", key.substr(0, key.rfind('.') + 1),
           "allowed_hosts to send the model's calls there");
}

HttpEndpoint::HttpEndpoint(const std::string& url, ProcessBounds bounds, const std::vector<std::string>& allowed_hosts,
                           const std::string& where)
    : text_(url), url_(parse_http_url(url, where + ": config.url")), bounds_(bounds) {
  HF_CHECK(bounds_.timeout_s > 0, where, ": config.timeout_s: expected > 0, got ", bounds_.timeout_s);
  HF_CHECK(bounds_.max_output_bytes > 0, where, ": config.max_output_bytes: expected > 0, got ",
           bounds_.max_output_bytes);
  check_http_host_allowed(url_, allowed_hosts, where, "config.url");
}

HttpResponse HttpEndpoint::post_json(const std::string& body, const std::string& client,
                                     std::vector<std::pair<std::string, std::string>> headers) const {
  HttpPostOptions options;
  options.timeout_s = bounds_.timeout_s;
  options.max_body_bytes = static_cast<size_t>(bounds_.max_output_bytes);
  options.headers = std::move(headers);
  options.client = client;
  return http_post(url_, "application/json", body, options);
}

HttpTool::HttpTool(Json schema, const std::string& url, ProcessBounds bounds,
                   const std::vector<std::string>& allowed_hosts, const std::string& where)
    : Tool(std::move(schema), where), endpoint_(url, bounds, allowed_hosts, where) {}

std::string HttpTool::describe() const { return endpoint_.describe(); }

ToolResult HttpTool::run(const Json& arguments, const Json& kwargs) const {
  std::vector<std::pair<std::string, std::string>> headers;
  // ensure_ascii: no byte of the header can be a line break or outside ASCII.
  if (!kwargs.is_null()) headers.push_back({"X-HF-Tool-Kwargs", kwargs.dump(-1, ' ', true)});
  HttpResponse reply;
  try {
    reply = endpoint_.post_json(arguments.dump(), "tool '" + name() + "'", std::move(headers));
  } catch (const HttpError& e) {
    ToolStatus status = e.kind() == HttpError::Kind::timed_out   ? ToolStatus::timed_out
                        : e.kind() == HttpError::Kind::too_large ? ToolStatus::output_limit
                                                                 : ToolStatus::failed;
    return ToolResult::error(status, e.what());
  }
  if (reply.status != 200) {
    std::string snippet = reply.body.size() <= 500 ? reply.body : reply.body.substr(0, 500) + "...";
    return ToolResult::error(ToolStatus::failed,
                             "tool '" + name() + "' answered HTTP " + std::to_string(reply.status) + ": " + snippet);
  }
  ToolResult result;
  result.text = reply.body;
  return result;
}

}  // namespace hybridflow::agent
