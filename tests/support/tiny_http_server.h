// A one-thread HTTP server on loopback for tests of HTTP clients (reward servers, tools, interactions).
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <thread>

namespace hybridflow::testing {

// A one-thread HTTP server on 127.0.0.1:<ephemeral> for the tests; `handler` gets the request head and
// body and returns the raw reply bytes ("" = never answer).
class TinyServer {
 public:
  using Handler = std::function<std::string(const std::string& head, const std::string& body)>;
  // Runs after the reply was sent, on the connection, until it returns (e.g. to drip more bytes); it should
  // return once `stop` is set or a send fails.
  using Streamer = std::function<void(int fd, const std::atomic<bool>& stop)>;
  explicit TinyServer(Handler handler, Streamer streamer = nullptr)
      : handler_(std::move(handler)), streamer_(std::move(streamer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    socklen_t len = sizeof addr;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    EXPECT_EQ(::listen(listen_fd_, 8), 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~TinyServer() {
    stop_ = true;
    thread_.join();
    ::close(listen_fd_);
  }
  int port() const { return port_; }
  std::string url(const std::string& path = "/score") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  std::string last_head() const { return last_head_; }

 private:
  void serve() {
    while (!stop_) {
      pollfd p{listen_fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) <= 0) continue;
      int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) continue;
      std::string raw;
      char buf[4096];
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      size_t head_end = std::string::npos;
      size_t want = 0;
      while (std::chrono::steady_clock::now() < deadline) {
        if (head_end != std::string::npos && raw.size() >= head_end + 4 + want) break;
        pollfd q{fd, POLLIN, 0};
        if (::poll(&q, 1, 50) <= 0) continue;
        ssize_t n = ::recv(fd, buf, sizeof buf, 0);
        if (n <= 0) break;
        raw.append(buf, static_cast<size_t>(n));
        if (head_end == std::string::npos && (head_end = raw.find("\r\n\r\n")) != std::string::npos) {
          size_t at = raw.find("Content-Length: ");
          if (at != std::string::npos) want = std::stoul(raw.substr(at + 16));
        }
      }
      std::string head = raw.substr(0, head_end);
      last_head_ = head;
      std::string reply = handler_(head, head_end == std::string::npos ? "" : raw.substr(head_end + 4));
      if (reply.empty()) {
        while (!stop_) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      } else {
        ::send(fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        if (streamer_) streamer_(fd, stop_);
      }
      ::close(fd);
    }
  }

  Handler handler_;
  Streamer streamer_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::string last_head_;
  std::thread thread_;
};

inline std::string http_reply(int status, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + body;
}

}  // namespace hybridflow::testing
