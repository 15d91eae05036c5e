#include "hybridflow/core/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "hybridflow/core/error.h"

// Every failure of a request is an HttpError; a bound that stopped it says which.
#define HF_HTTP_CHECK(kind, cond, ...) \
  do {                                  \
    if (!(cond)) throw ::hybridflow::HttpError(::hybridflow::HttpError::Kind::kind, ::hybridflow::detail::concat(__VA_ARGS__)); \
  } while (0)

namespace hybridflow {
namespace http_client_detail {

using Clock = std::chrono::steady_clock;

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(left, 1 << 30)));
}

std::string host_port(const HttpUrl& url) {
  bool v6 = url.host.find(':') != std::string::npos;
  return (v6 ? "[" + url.host + "]" : url.host) + ":" + std::to_string(url.port);
}

std::string url_text(const HttpUrl& url) { return "http://" + host_port(url) + url.path; }

// A reply head (status line and headers) longer than this is not a scoring server's.
constexpr size_t kMaxHeadBytes = 64u << 10;

class Socket {
 public:
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() {
    if (fd_ >= 0) ::close(fd_);
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_;
};

// Non-blocking connect bounded by the deadline; tries every address the name resolves to.
int connect_with_deadline(const HttpUrl& url, Clock::time_point deadline, const std::string& client) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(url.host.c_str(), std::to_string(url.port).c_str(), &hints, &found);
  HF_HTTP_CHECK(failed, rc == 0, client, ": cannot resolve ", host_port(url), ": ", gai_strerror(rc));
  std::string last_error = "no address";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    int s = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (s < 0) continue;
    int c = ::connect(s, a->ai_addr, a->ai_addrlen);
    if (c != 0 && errno == EINPROGRESS) {
      pollfd p{s, POLLOUT, 0};
      int ready = ::poll(&p, 1, ms_left(deadline));
      if (ready == 0) {
        errno = ETIMEDOUT;
      } else {
        int so_error = 0;
        socklen_t len = sizeof so_error;
        ::getsockopt(s, SOL_SOCKET, SO_ERROR, &so_error, &len);
        c = so_error == 0 ? 0 : -1;
        errno = so_error;
      }
    }
    if (c == 0) {
      fd = s;
    } else {
      last_error = std::strerror(errno);
      ::close(s);
    }
  }
  ::freeaddrinfo(found);
  HF_HTTP_CHECK(failed, fd >= 0, client, ": cannot connect to ", host_port(url), ": ", last_error,
           " (is the scoring server running?)");
  return fd;
}

void send_all(int fd, const std::string& data, const HttpUrl& url, Clock::time_point deadline,
              const std::string& client) {
  size_t sent = 0;
  while (sent < data.size()) {
    HF_HTTP_CHECK(timed_out, Clock::now() < deadline, client, ": timed out sending the request to ", url_text(url), " (",
             sent, " of ", data.size(), " bytes sent)");
    pollfd p{fd, POLLOUT, 0};
    int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;  // the deadline check above reports it
    ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    HF_HTTP_CHECK(failed, n > 0, client, ": sending to ", host_port(url), " failed: ", std::strerror(errno));
    sent += static_cast<size_t>(n);
  }
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

std::string decode_chunked(const std::string& body, const HttpUrl& url, const std::string& client) {
  std::string out;
  size_t pos = 0;
  while (true) {
    size_t eol = body.find("\r\n", pos);
    HF_HTTP_CHECK(failed, eol != std::string::npos, client, ": malformed chunked reply from ", host_port(url));
    size_t size = 0;
    try {
      size = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
    } catch (const std::exception&) {
      throw HttpError(HttpError::Kind::failed, detail::concat(client, ": malformed chunk size from ", host_port(url)));
    }
    pos = eol + 2;
    if (size == 0) return out;
    HF_HTTP_CHECK(failed, pos + size <= body.size(), client, ": chunked reply from ", host_port(url), " was cut off");
    out.append(body, pos, size);
    pos += size + 2;
  }
}

}  // namespace http_client_detail

using namespace http_client_detail;

HttpUrl parse_http_url(const std::string& url, const std::string& key) {
  const std::string scheme = "http://";
  HF_CHECK(url.rfind(scheme, 0) == 0, key, ": expected http://HOST:PORT/PATH, got '", url,
           "' (only plain http is supported)");
  std::string rest = url.substr(scheme.size());
  size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  HttpUrl out;
  out.path = slash == std::string::npos ? "/" : rest.substr(slash);
  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {
    size_t close = authority.find(']');
    HF_CHECK(close != std::string::npos, key, ": unterminated [IPv6] host in '", url, "'");
    out.host = authority.substr(1, close - 1);
    if (close + 1 < authority.size()) {
      HF_CHECK(authority[close + 1] == ':', key, ": expected ':' after ] in '", url, "'");
      port_text = authority.substr(close + 2);
    }
  } else {
    size_t colon = authority.find(':');
    out.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  HF_CHECK(!out.host.empty(), key, ": no host in '", url, "'");
  if (!port_text.empty()) {
    bool digits = port_text.find_first_not_of("0123456789") == std::string::npos && port_text.size() <= 5;
    int port = digits ? std::stoi(port_text) : -1;
    HF_CHECK(port >= 1 && port <= 65535, key, ": bad port '", port_text, "' in '", url, "'");
    out.port = port;
  }
  return out;
}

HttpResponse http_post(const HttpUrl& url, const std::string& content_type, const std::string& body,
                       const HttpPostOptions& options) {
  const double timeout_s = options.timeout_s;
  const size_t max_body_bytes = options.max_body_bytes;
  const std::string& client = options.client;
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  Socket socket(connect_with_deadline(url, deadline, client));
  std::string request = "POST " + url.path + " HTTP/1.1\r\nHost: " + host_port(url) +
                        "\r\nContent-Type: " + content_type + "\r\nContent-Length: " + std::to_string(body.size()) +
                        "\r\nConnection: close\r\n";
  for (const auto& [name, value] : options.headers) {
    HF_HTTP_CHECK(failed, name.find_first_of("\r\n:") == std::string::npos && value.find_first_of("\r\n") == std::string::npos,
             client, ": header '", name, "' contains a line break or colon");
    request += name + ": " + value + "\r\n";
  }
  request += "\r\n" + body;
  send_all(socket.fd(), request, url, deadline, client);

  // Read to EOF (Connection: close), or until Content-Length bytes of body arrived.
  std::string raw;
  size_t header_end = std::string::npos;
  long long content_length = -1;
  char buffer[65536];
  while (true) {
    if (header_end != std::string::npos && content_length >= 0 &&
        raw.size() >= header_end + 4 + static_cast<size_t>(content_length))
      break;
    // poll() below returns at once while bytes are waiting, so a server that streams faster than we read
    // would never hit its timeout: the deadline is checked here, over the whole reply.
    HF_HTTP_CHECK(timed_out, Clock::now() < deadline, client, ": no complete reply from ", url_text(url), " within ", timeout_s,
             " s (", raw.size(), " bytes read so far; ", options.timeout_key, " bounds the whole request)");
    if (header_end == std::string::npos) {
      HF_HTTP_CHECK(too_large, raw.size() <= kMaxHeadBytes, client, ": the reply head from ", url_text(url), " exceeds ",
               kMaxHeadBytes, " bytes without ending (no blank line after the headers)");
    } else {
      HF_HTTP_CHECK(too_large, raw.size() - header_end - 4 <= max_body_bytes, client, ": the reply body from ", url_text(url),
               " exceeds ", max_body_bytes, " bytes (", options.max_body_key, "); stopped reading");
    }
    pollfd p{socket.fd(), POLLIN, 0};
    int ready = ::poll(&p, 1, ms_left(deadline));
    if (ready == 0 || (ready < 0 && errno == EINTR)) continue;  // the deadline check above reports it
    ssize_t n = ::recv(socket.fd(), buffer, sizeof buffer, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    HF_HTTP_CHECK(failed, n >= 0, client, ": reading the reply from ", host_port(url), " failed: ", std::strerror(errno));
    if (n == 0) break;
    raw.append(buffer, static_cast<size_t>(n));
    if (header_end == std::string::npos) {
      header_end = raw.find("\r\n\r\n");
      if (header_end != std::string::npos) {
        std::string headers = lower(raw.substr(0, header_end));
        size_t at = headers.find("\r\ncontent-length:");
        if (at != std::string::npos) content_length = std::atoll(headers.c_str() + at + 17);
        // Refused before a byte of it is read.
        HF_HTTP_CHECK(too_large, content_length < 0 || static_cast<unsigned long long>(content_length) <= max_body_bytes,
                 client, ": ", url_text(url), " announced a reply body of ", content_length,
                 " bytes (Content-Length), more than ", options.max_body_key, " (", max_body_bytes, ")");
      }
    }
  }
  HF_HTTP_CHECK(failed, header_end != std::string::npos, client, ": ", host_port(url), " closed the connection without a ",
           "complete HTTP reply (got ", raw.size(), " bytes)");
  HttpResponse response;
  std::string headers = raw.substr(0, header_end);
  HF_HTTP_CHECK(failed, headers.rfind("HTTP/1.", 0) == 0 && headers.size() >= 12, client, ": ", host_port(url),
           " did not answer with HTTP (status line '", headers.substr(0, headers.find("\r\n")), "')");
  response.status = std::atoi(headers.c_str() + 9);
  response.body = raw.substr(header_end + 4);
  std::string lowered = lower(headers);
  if (content_length >= 0) {
    HF_HTTP_CHECK(failed, response.body.size() >= static_cast<size_t>(content_length), client, ": reply from ", host_port(url),
             " was cut off (", response.body.size(), " of ", content_length, " body bytes)");
    response.body.resize(static_cast<size_t>(content_length));
  } else if (lowered.find("transfer-encoding: chunked") != std::string::npos) {
    response.body = decode_chunked(response.body, url, client);
  }
  return response;
}

}  // namespace hybridflow

#undef HF_HTTP_CHECK
