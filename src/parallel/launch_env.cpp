#include "hybridflow/parallel/launch_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <vector>

#include "hybridflow/core/error.h"

extern char** environ;

namespace hybridflow {
namespace {

using Env = std::map<std::string, std::string>;

bool has(const Env& env, const std::string& key) { return env.count(key) > 0; }

int parse_int(const Env& env, const std::string& key, const std::string& launcher) {
  auto it = env.find(key);
  HF_CHECK(it != env.end(), "launch environment (", launcher, "): variable ", key, " is not set");
  const std::string& text = it->second;
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  HF_CHECK(!text.empty() && end == text.c_str() + text.size() && errno == 0 && value >= INT_MIN &&
               value <= INT_MAX,
           "launch environment (", launcher, "): ", key, "=", text, " is not an integer");
  return static_cast<int>(value);
}

int parse_int_or(const Env& env, const std::string& key, const std::string& launcher, int fallback) {
  return has(env, key) ? parse_int(env, key, launcher) : fallback;
}

const std::string* first_of(const Env& env, const std::vector<std::string>& keys) {
  for (const auto& key : keys) {
    auto it = env.find(key);
    if (it != env.end() && !it->second.empty()) return &it->second;
  }
  return nullptr;
}

// Port from the first present variable of keys, else the default.
int master_port(const Env& env, const std::vector<std::string>& keys, const std::string& launcher,
                bool required) {
  for (const auto& key : keys) {
    if (has(env, key)) {
      int port = parse_int(env, key, launcher);
      HF_CHECK(port > 0 && port < 65536, "launch environment (", launcher, "): ", key, "=", port,
               " is not a TCP port (1..65535)");
      return port;
    }
  }
  HF_CHECK(!required, "launch environment (", launcher, "): variable ", keys.front(), " is not set");
  return LaunchEnv{}.master_port;
}

void validate(const LaunchEnv& out, const std::string& rank_key, const std::string& size_key,
              const std::string& local_key) {
  const std::string& who = out.launcher;
  HF_CHECK(out.world_size >= 1, "launch environment (", who, "): ", size_key, "=", out.world_size,
           " must be >= 1");
  HF_CHECK(out.rank >= 0 && out.rank < out.world_size, "launch environment (", who, "): ", rank_key, "=",
           out.rank, " must be in [0, ", size_key, "=", out.world_size, ")");
  HF_CHECK(out.local_rank >= 0, "launch environment (", who, "): ", local_key, "=", out.local_rank,
           " must be >= 0");
  HF_CHECK(out.local_world_size == 0 || out.local_rank < out.local_world_size, "launch environment (", who,
           "): ", local_key, "=", out.local_rank, " must be below the local world size ",
           out.local_world_size);
  HF_CHECK(!out.master_addr.empty(), "launch environment (", who, "): empty master address");
}

LaunchEnv from_torchrun(const Env& env) {
  LaunchEnv out;
  out.launcher = "torchrun";
  out.rank = parse_int(env, "RANK", out.launcher);
  out.world_size = parse_int(env, "WORLD_SIZE", out.launcher);
  out.local_rank = parse_int(env, "LOCAL_RANK", out.launcher);
  out.local_world_size = parse_int_or(env, "LOCAL_WORLD_SIZE", out.launcher, 0);
  const std::string* addr = first_of(env, {"MASTER_ADDR"});
  HF_CHECK(addr != nullptr, "launch environment (torchrun): variable MASTER_ADDR is not set");
  out.master_addr = *addr;
  out.master_port = master_port(env, {"MASTER_PORT"}, out.launcher, true);
  validate(out, "RANK", "WORLD_SIZE", "LOCAL_RANK");
  return out;
}

LaunchEnv from_mpirun(const Env& env) {
  LaunchEnv out;
  out.launcher = "mpirun";
  out.rank = parse_int(env, "OMPI_COMM_WORLD_RANK", out.launcher);
  out.world_size = parse_int(env, "OMPI_COMM_WORLD_SIZE", out.launcher);
  out.local_rank = parse_int_or(env, "OMPI_COMM_WORLD_LOCAL_RANK", out.launcher, 0);
  out.local_world_size = parse_int_or(env, "OMPI_COMM_WORLD_LOCAL_SIZE", out.launcher, 0);
  const std::string* addr = first_of(env, {"MASTER_ADDR", "HF_MASTER_ADDR"});
  // mpirun gives no rendezvous address; a one-process job needs none.
  HF_CHECK(addr != nullptr || out.world_size == 1,
           "launch environment (mpirun): set MASTER_ADDR or HF_MASTER_ADDR to the address of rank 0");
  if (addr != nullptr) out.master_addr = *addr;
  out.master_port = master_port(env, {"MASTER_PORT", "HF_MASTER_PORT"}, out.launcher, false);
  validate(out, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK");
  return out;
}

LaunchEnv from_srun(const Env& env) {
  LaunchEnv out;
  out.launcher = "srun";
  out.rank = parse_int(env, "SLURM_PROCID", out.launcher);
  out.world_size = parse_int(env, "SLURM_NTASKS", out.launcher);
  out.local_rank = parse_int_or(env, "SLURM_LOCALID", out.launcher, 0);
  if (const std::string* addr = first_of(env, {"MASTER_ADDR", "HF_MASTER_ADDR", "SLURM_LAUNCH_NODE_IPADDR"})) {
    out.master_addr = *addr;
  } else if (const std::string* list = first_of(env, {"SLURM_JOB_NODELIST", "SLURM_NODELIST"})) {
    out.master_addr = first_slurm_host(*list);
  } else {
    HF_CHECK(out.world_size == 1, "launch environment (srun): no master address: set MASTER_ADDR, "
             "SLURM_LAUNCH_NODE_IPADDR or SLURM_JOB_NODELIST");
  }
  out.master_port = master_port(env, {"MASTER_PORT", "HF_MASTER_PORT"}, out.launcher, false);
  validate(out, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID");
  return out;
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  HF_CHECK(!nodelist.empty(), "SLURM_JOB_NODELIST is empty");
  // The first entry ends at the first comma outside brackets.
  size_t end = 0;
  int depth = 0;
  for (; end < nodelist.size(); ++end) {
    char c = nodelist[end];
    if (c == '[') ++depth;
    if (c == ']') --depth;
    HF_CHECK(depth >= 0 && depth <= 1, "SLURM_JOB_NODELIST=", nodelist, ": unbalanced brackets");
    if (c == ',' && depth == 0) break;
  }
  HF_CHECK(depth == 0, "SLURM_JOB_NODELIST=", nodelist, ": unbalanced brackets");
  std::string entry = nodelist.substr(0, end);
  size_t open = entry.find('[');
  if (open == std::string::npos) {
    HF_CHECK(!entry.empty(), "SLURM_JOB_NODELIST=", nodelist, ": empty first host");
    return entry;
  }
  size_t close = entry.find(']', open);
  std::string range = entry.substr(open + 1, close - open - 1);
  std::string first = range.substr(0, range.find_first_of(",-"));
  HF_CHECK(!first.empty(), "SLURM_JOB_NODELIST=", nodelist, ": empty host range");
  // Zero padding is part of the name ("node[01-04]" -> node01), so the text is kept as written.
  return entry.substr(0, open) + first + entry.substr(close + 1);
}

LaunchEnv launch_env_from(const Env& env) {
  if (has(env, "RANK") || has(env, "WORLD_SIZE")) return from_torchrun(env);
  if (has(env, "OMPI_COMM_WORLD_RANK") || has(env, "OMPI_COMM_WORLD_SIZE")) return from_mpirun(env);
  // salloc alone sets SLURM_NTASKS but no SLURM_PROCID: only a task started by srun is a rank.
  if (has(env, "SLURM_PROCID")) return from_srun(env);
  LaunchEnv out;
  if (const std::string* addr = first_of(env, {"MASTER_ADDR", "HF_MASTER_ADDR"})) out.master_addr = *addr;
  out.master_port = master_port(env, {"MASTER_PORT", "HF_MASTER_PORT"}, out.launcher, false);
  return out;
}

LaunchEnv launch_env_from_environment() {
  Env env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    size_t eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return launch_env_from(env);
}

}  // namespace hybridflow
