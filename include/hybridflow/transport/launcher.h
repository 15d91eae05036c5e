// Running one job as the ranks of a standard launcher (torchrun, mpirun, srun): the same binary starts
// world_size times; one rank is the controller, every other rank becomes a worker process of one of the
// controller's resource pools. Nothing changes for algorithm code: Controller::add_pools hands out
// launcher ranks instead of spawning children.
//
// The contract (docs/cluster.md):
//   1. The controller rank (HF_CONTROLLER_RANK, default 0; it must run on MASTER_ADDR's host) listens
//      on a rendezvous socket at bind_addr:rendezvous_port.
//   2. Every other rank connects to MASTER_ADDR:rendezvous_port from run_worker_if_requested(), and
//      waits, answered every heartbeat, until a pool claims it.
//   3. Pools claim worker ranks in ascending launcher-rank order, in the order the controller creates
//      them; pool sizes must add up to at most world_size - 1 (more is an Error naming the numbers;
//      ranks no pool claimed are released, exit code 0, when the controller process exits).
//   4. A claimed rank is told its pool, its rank in the pool and the pool's endpoint, and serves it as a
//      normal worker. Every message is authenticated with a key derived from the job secret
//      (HF_JOB_TOKEN or HF_JOB_TOKEN_FILE); others are dropped (docs/security.md).
#pragma once

#include <map>
#include <string>

#include "hybridflow/parallel/launch_env.h"

namespace hybridflow {

struct LaunchSettings {
  LaunchEnv env;
  int controller_rank = 0;   // HF_CONTROLLER_RANK
  std::string token;         // the job secret: HF_JOB_TOKEN, or the contents of the file HF_JOB_TOKEN_FILE
  std::string token_source;  // the variable the secret came from, for messages
  // Where the controller listens: HF_BIND_ADDR, else MASTER_ADDR resolved to an IPv4 address (so a
  // single-host launch with MASTER_ADDR=127.0.0.1 never leaves loopback). "0.0.0.0" = every interface.
  std::string bind_addr;
  // HF_RENDEZVOUS_PORT, else MASTER_PORT; MASTER_PORT + 1 when a torchrun agent already serves its
  // store on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True).
  int rendezvous_port = 0;
  int pool_port_base = 0;            // HF_POOL_PORT_BASE: pool i listens on base + i; 0 = any free port
  double heartbeat_timeout_s = 0;    // HF_HEARTBEAT_TIMEOUT_S for every launched pool; 0 = each pool's own

  bool multi_rank() const { return env.world_size > 1; }
  bool is_controller() const { return env.rank == controller_rank; }
  // What workers connect to: tcp://MASTER_ADDR:port.
  std::string endpoint(int port) const;
};

// Reads the settings from a map of environment variables. Error naming the variable when one is
// malformed, when a multi-rank launch has no usable secret (check_job_secret; a token file others can
// read) or MASTER_ADDR does not resolve.
LaunchSettings launch_settings_from(const std::map<std::string, std::string>& env);

// Refuses (Error naming `source`) a job secret that is short, a documented example or barely random.
inline constexpr size_t kMinJobSecretChars = 32;
void check_job_secret(const std::string& secret, const std::string& source);

// The keys of a pool's worker environment (ResourcePool::env) a launched worker applies; the others are
// ignored with a warning, so a forged assignment cannot set PATH or LD_PRELOAD.
bool pool_env_key_allowed(const std::string& key);

// The settings of this process (read once, on first use).
const LaunchSettings& launch_settings();

// Environment variables a launched worker finds set while it serves its pool.
inline constexpr const char* kLaunchRankEnv = "HF_LAUNCH_RANK";            // its launcher rank
inline constexpr const char* kControllerAddrEnv = "HF_CONTROLLER_ADDR";    // where it reached the controller

}  // namespace hybridflow
