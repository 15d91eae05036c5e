// The live dashboard (`hybridflow train --dashboard`): the report served over HTTP on loopback, a waiting
// page before the first step, and nothing else answered: other paths, other methods, other Host names.
#include "hybridflow/report/dashboard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "support/temp_dir.h"

namespace hybridflow::report {
namespace {

using hybridflow::testing::TempDir;

// Sends `request` to 127.0.0.1:port and reads the response until the server closes the connection.
std::string http(int port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  EXPECT_EQ(::send(fd, request.data(), request.size(), 0), static_cast<ssize_t>(request.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

std::string get(int port, const std::string& path, const std::string& host) {
  return http(port, "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: test\r\n\r\n");
}

TEST(Dashboard, ServesTheLiveReportOnLoopbackAndNothingElse) {
  TempDir dir;
  DashboardServer server(dir.path(), 0, 7);
  ASSERT_GT(server.port(), 0);
  EXPECT_EQ(server.url(), "http://127.0.0.1:" + std::to_string(server.port()) + "/");
  const std::string host = "127.0.0.1:" + std::to_string(server.port());

  // Before the first step: a page that says so and reloads.
  std::string waiting = get(server.port(), "/", host);
  EXPECT_EQ(waiting.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << waiting;
  EXPECT_NE(waiting.find("waiting for the first step"), std::string::npos) << waiting;
  EXPECT_NE(waiting.find("<meta http-equiv=\"refresh\" content=\"7\">"), std::string::npos);

  std::ofstream(dir.file("metrics.jsonl")) << "{\"step\":1,\"score/mean\":0.25}\n{\"step\":2,\"score/mean\":0.5}\n";
  const std::string page = get(server.port(), "/", "localhost:" + std::to_string(server.port()));
  EXPECT_EQ(page.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << page.substr(0, 300);
  EXPECT_NE(page.find("Content-Type: text/html; charset=utf-8\r\n"), std::string::npos);
  EXPECT_NE(page.find("Content-Security-Policy: default-src 'none'"), std::string::npos);
  EXPECT_NE(page.find("<meta http-equiv=\"refresh\" content=\"7\">"), std::string::npos);
  EXPECT_NE(page.find("<svg"), std::string::npos) << "the report's charts";
  const size_t body = page.find("\r\n\r\n") + 4;
  EXPECT_NE(page.find("Content-Length: " + std::to_string(page.size() - body) + "\r\n"), std::string::npos);

  EXPECT_EQ(get(server.port(), "/../metrics.jsonl", host).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(get(server.port(), "/metrics.jsonl", host).rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(http(server.port(), "POST / HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 0\r\n\r\n").rfind("HTTP/1.1 405", 0),
            0u);
  // A page on another site that rebinds its name to 127.0.0.1 sends its own Host: refused.
  EXPECT_EQ(get(server.port(), "/", "attacker.example:" + std::to_string(server.port())).rfind("HTTP/1.1 403", 0), 0u);
  EXPECT_EQ(http(server.port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 403", 0), 0u);  // no Host at all
  EXPECT_EQ(http(server.port(), "nonsense\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
}

TEST(Dashboard, AnOversizedRequestIsRefusedWithoutReadingOn) {
  TempDir dir;
  DashboardServer server(dir.path(), 0);
  const std::string huge = "GET / HTTP/1.1\r\nX: " + std::string(20000, 'a');  // never ends its headers
  EXPECT_EQ(http(server.port(), huge).rfind("HTTP/1.1 400", 0), 0u);
  // The server still answers afterwards.
  EXPECT_EQ(get(server.port(), "/", "127.0.0.1:" + std::to_string(server.port())).rfind("HTTP/1.1 200", 0), 0u);
}

}  // namespace
}  // namespace hybridflow::report
