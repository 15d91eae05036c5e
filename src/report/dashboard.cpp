#include "hybridflow/report/dashboard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/report/html_escape.h"
#include "hybridflow/report/html_report.h"

namespace hybridflow::report {
namespace {

constexpr size_t kMaxRequestBytes = 8192;  // a GET without a body; anything longer is not ours

std::string response(int status, const std::string& reason, const std::string& body) {
  // The report has no scripts and fetches nothing: the policy says so to the browser too.
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nCache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
         "Content-Security-Policy: default-src 'none'; style-src 'unsafe-inline'; img-src data:\r\n"
         "Connection: close\r\n\r\n" + body;
}

std::string refresh_meta(int refresh_s) {
  return "<meta http-equiv=\"refresh\" content=\"" + std::to_string(refresh_s) + "\">";
}

// The value of header `name` (case-insensitive), "" when absent.
std::string header(const std::string& request, const std::string& name) {
  std::istringstream in(request);
  std::string line;
  std::getline(in, line);  // the request line
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon != name.size()) continue;
    if (strncasecmp(line.c_str(), name.c_str(), name.size()) != 0) continue;
    const size_t value = line.find_first_not_of(" \t", colon + 1);
    return value == std::string::npos ? "" : line.substr(value);
  }
  return "";
}

}  // namespace

std::string dashboard_response(const std::string& run_dir, const std::string& request, int port, int refresh_s) {
  std::istringstream line(request.substr(0, request.find("\r\n")));
  std::string method, target, version;
  line >> method >> target >> version;
  if (version.rfind("HTTP/1.", 0) != 0) return response(400, "Bad Request", "bad request\n");
  const std::string host = header(request, "Host");
  const std::string p = std::to_string(port);
  if (host != "127.0.0.1:" + p && host != "localhost:" + p)
    return response(403, "Forbidden", "this dashboard answers only http://127.0.0.1:" + p + "/\n");
  if (method != "GET") return response(405, "Method Not Allowed", "only GET\n");
  if (target != "/") return response(404, "Not Found", "not found; the report is at /\n");
  std::string html;
  try {
    html = render_html_report(run_dir);
  } catch (const Error& e) {  // no metrics yet: the first step is still running
    return response(200, "OK",
                    "<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\">" + refresh_meta(refresh_s) +
                        "<title>hybridflow run</title></head><body><p>" + html_escape(run_dir) +
                        ": waiting for the first step (" + html_escape(e.what()) + ")</p></body></html>\n");
  }
  const size_t head = html.find("<head>");
  if (head != std::string::npos) html.insert(head + 6, "\n" + refresh_meta(refresh_s));
  return response(200, "OK", html);
}

DashboardServer::DashboardServer(std::string run_dir, int port, int refresh_s)
    : run_dir_(std::move(run_dir)), refresh_s_(refresh_s < 1 ? 1 : refresh_s) {
  HF_CHECK(port >= 0 && port <= 65535, "dashboard: port ", port, " is not in 0..65535");
  // Close-on-exec: the trainer execs its workers, which must not inherit the listening socket.
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  HF_CHECK(listen_fd_ >= 0, "dashboard: socket: ", std::strerror(errno));
  int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(listen_fd_, 8) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    HF_FAIL("dashboard: cannot listen on 127.0.0.1:", port, ": ", why);
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  thread_ = std::thread([this] { serve(); });
}

DashboardServer::~DashboardServer() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  ::close(listen_fd_);
}

void DashboardServer::serve() {
  while (!stop_) {
    pollfd p{listen_fd_, POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;  // wakes up to notice stop_
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    // A client that sends nothing must not hold the server: reads and writes give up after 2 s.
    timeval timeout{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    std::string request;
    char buf[2048];
    while (request.find("\r\n\r\n") == std::string::npos && request.size() < kMaxRequestBytes) {
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      request.append(buf, static_cast<size_t>(n));
    }
    std::string out;
    try {
      out = request.find("\r\n\r\n") == std::string::npos ? response(400, "Bad Request", "bad request\n")
                                                          : dashboard_response(run_dir_, request, port_, refresh_s_);
    } catch (const std::exception& e) {  // a half-written file mid-step: say so, the next reload works
      out = response(500, "Internal Server Error", html_escape(e.what()) + "\n");
    }
    for (size_t sent = 0; sent < out.size();) {
      const ssize_t n = ::send(fd, out.data() + sent, out.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    // Closing with unread request bytes would reset the connection and could lose the response on its
    // way: end our side, then read what the client still sends (1 s and 64 KiB at most) before closing.
    ::shutdown(fd, SHUT_WR);
    size_t drained = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
    while (drained < 65536 && std::chrono::steady_clock::now() < until) {
      pollfd c{fd, POLLIN, 0};
      if (::poll(&c, 1, 100) <= 0) continue;
      const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
      if (n <= 0) break;
      drained += static_cast<size_t>(n);
    }
    ::close(fd);
  }
}

}  // namespace hybridflow::report
