// `hybridflow train --dashboard`: the HTML run report served live on loopback while the run trains, each
// request rendered afresh from the run directory and the page reloading itself. Only 127.0.0.1 is bound,
// only GET of "/" is answered, and a request whose Host is not this loopback address is refused (a web page
// elsewhere cannot read it through DNS rebinding). Plain POSIX sockets, one request at a time.
#pragma once

#include <atomic>
#include <string>
#include <thread>

namespace hybridflow::report {

class DashboardServer {
 public:
  // Listens on 127.0.0.1:port (0: any free port) and serves on a thread of its own. Throws
  // hybridflow::Error naming the port when it cannot bind.
  DashboardServer(std::string run_dir, int port, int refresh_s = 10);
  ~DashboardServer();  // stops serving and joins the thread
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_) + "/"; }

 private:
  void serve();

  std::string run_dir_;
  int refresh_s_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The whole HTTP response to `request` (its text up to the blank line) for a server on `port`; exposed for
// tests. Before the run's first step it is a page that says so and reloads itself.
std::string dashboard_response(const std::string& run_dir, const std::string& request, int port, int refresh_s);

}  // namespace hybridflow::report
