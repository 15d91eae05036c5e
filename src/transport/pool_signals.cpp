// Signals that must not leave workers behind: a terminal's Ctrl-C reaches only the controller (the
// workers run in process groups of their own), so the handler kills every live pool's group, unless a
// graceful stop was asked for (enable_graceful_stop_on_signals).
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "hybridflow/core/logging.h"
#include "pool_impl.h"

namespace hybridflow::transport_detail {
namespace {

// Process groups of live pools, read by the signal handler (which may only use async-signal-safe calls).
constexpr int kMaxPools = 64;
std::atomic<int> g_pool_pgids[kMaxPools];

void kill_pools_and_reraise(int sig) {
  for (auto& slot : g_pool_pgids) {
    int pgid = slot.load();
    if (pgid > 0) ::kill(-pgid, SIGKILL);
  }
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

std::atomic<bool> g_graceful_stop{false};
std::atomic<int> g_stop_signal{0};

void on_signal(int sig) {
  int none = 0;
  if (g_graceful_stop.load() && (sig == SIGINT || sig == SIGTERM) && g_stop_signal.compare_exchange_strong(none, sig)) {
    static const char kMessage[] = "\n[hybridflow] stopping after the current step; signal again to stop at once\n";
    ssize_t ignored = ::write(2, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
    return;
  }
  kill_pools_and_reraise(sig);
}

}  // namespace

void install_signal_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa;
    std::memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) ::sigaction(sig, &sa, nullptr);
  });
}

void register_pgid(int pgid) {
  for (auto& slot : g_pool_pgids) {
    int expected = 0;
    if (slot.compare_exchange_strong(expected, pgid)) return;
  }
  log_warn("more than ", kMaxPools, " resource pools: Ctrl-C cleanup covers only the first ", kMaxPools);
}

void unregister_pgid(int pgid) {
  for (auto& slot : g_pool_pgids) {
    int expected = pgid;
    if (slot.compare_exchange_strong(expected, 0)) return;
  }
}

}  // namespace hybridflow::transport_detail

namespace hybridflow {

void enable_graceful_stop_on_signals() {
  transport_detail::g_graceful_stop = true;
  transport_detail::install_signal_handlers();  // also before any pool starts: a signal while loading data is graceful too
}

int stop_requested_signal() { return transport_detail::g_stop_signal.load(); }

}  // namespace hybridflow
