// Launch settings: which rank controls, the job token, where the controller listens.
#include "hybridflow/runtime/launcher.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <tuple>
#include <vector>

#include "hybridflow/core/error.h"

extern char** environ;

namespace hybridflow {
namespace {

using Env = std::map<std::string, std::string>;

std::string value_of(const Env& env, const std::string& key) {
  auto it = env.find(key);
  return it == env.end() ? std::string() : it->second;
}

int int_of(const Env& env, const std::string& key, int fallback, int lo, int hi) {
  const std::string text = value_of(env, key);
  if (text.empty()) return fallback;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text.c_str(), &end, 10);
  HF_CHECK(end == text.c_str() + text.size() && errno == 0 && v >= lo && v <= hi, "launch environment: ", key, "=",
           text, " must be an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(v);
}

// A token every rank of one job computes alike. Launcher job ids separate concurrent jobs but are not
// secret; OpenMPI's precondition key is random per job.
std::pair<std::string, std::string> job_token(const Env& env) {
  if (!value_of(env, "HF_JOB_TOKEN").empty()) return {value_of(env, "HF_JOB_TOKEN"), "HF_JOB_TOKEN"};
  const std::string run_id = value_of(env, "TORCHELASTIC_RUN_ID");
  if (!run_id.empty() && run_id != "none") return {"torchrun-" + run_id, "TORCHELASTIC_RUN_ID"};
  for (const char* key : {"OMPI_MCA_orte_precondition_transports", "OMPI_MCA_ess_base_jobid"})
    if (!value_of(env, key).empty()) return {"mpirun-" + value_of(env, key), key};
  if (!value_of(env, "SLURM_JOB_ID").empty())
    return {"slurm-" + value_of(env, "SLURM_JOB_ID") + "." + value_of(env, "SLURM_STEP_ID"), "SLURM_JOB_ID"};
  return {"", ""};
}

std::string resolve_ipv4(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &found);
  HF_CHECK(rc == 0 && found != nullptr, "launch environment: MASTER_ADDR=", host,
           " does not resolve to an IPv4 address (", ::gai_strerror(rc), "); set HF_BIND_ADDR to the address the "
           "controller should listen on");
  char text[INET_ADDRSTRLEN] = {0};
  ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
  ::freeaddrinfo(found);
  return text;
}

}  // namespace

std::string LaunchSettings::endpoint(int port) const {
  return "tcp://" + env.master_addr + ":" + std::to_string(port);
}

LaunchSettings launch_settings_from(const Env& env) {
  LaunchSettings s;
  s.env = launch_env_from(env);
  if (!s.multi_rank()) return s;
  const int world = s.env.world_size;
  s.controller_rank = int_of(env, "HF_CONTROLLER_RANK", 0, 0, world - 1);
  std::tie(s.token, s.token_source) = job_token(env);
  HF_CHECK(!s.token.empty(), "launch environment (", s.env.launcher, ", world_size ", world,
           "): no job token: export HF_JOB_TOKEN=<the same secret on every rank> before launching (or give "
           "torchrun a --rdzv-id)");
  const bool agent_store = value_of(env, "TORCHELASTIC_USE_AGENT_STORE") == "True";
  s.rendezvous_port = int_of(env, "HF_RENDEZVOUS_PORT", s.env.master_port + (agent_store ? 1 : 0), 1, 65535);
  s.pool_port_base = int_of(env, "HF_POOL_PORT_BASE", 0, 0, 65535);
  const std::string timeout = value_of(env, "HF_HEARTBEAT_TIMEOUT_S");
  if (!timeout.empty()) {
    char* end = nullptr;
    s.heartbeat_timeout_s = std::strtod(timeout.c_str(), &end);
    HF_CHECK(end == timeout.c_str() + timeout.size() && s.heartbeat_timeout_s > 0,
             "launch environment: HF_HEARTBEAT_TIMEOUT_S=", timeout, " must be a positive number of seconds");
  }
  s.bind_addr = value_of(env, "HF_BIND_ADDR");
  // Only the controller listens, so only it needs MASTER_ADDR to name one of its own interfaces.
  if (s.bind_addr.empty() && s.is_controller()) s.bind_addr = resolve_ipv4(s.env.master_addr);
  return s;
}

const LaunchSettings& launch_settings() {
  static std::once_flag once;
  static std::unique_ptr<LaunchSettings> settings;
  std::call_once(once, [] {
    Env env;
    for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
      std::string text(*entry);
      size_t eq = text.find('=');
      if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
    }
    settings = std::make_unique<LaunchSettings>(launch_settings_from(env));
  });
  return *settings;
}

}  // namespace hybridflow
