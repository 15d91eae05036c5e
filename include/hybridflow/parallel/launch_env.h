// Where this process sits in a multi-process job, read from the environment a standard launcher sets.
//
// Recognised launchers, first match wins:
//   torchrun  RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (all required but
//             LOCAL_WORLD_SIZE).
//   mpirun    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK (and _LOCAL_SIZE);
//             master from MASTER_ADDR/MASTER_PORT, else HF_MASTER_ADDR/HF_MASTER_PORT.
//   srun      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; master from MASTER_ADDR/HF_MASTER_ADDR, else
//             SLURM_LAUNCH_NODE_IPADDR, else the first host of SLURM_JOB_NODELIST ("node[01-04]" -> node01).
//   single    none of the above: rank 0 of 1 on 127.0.0.1.
// The master port defaults to 29500 (torchrun's default) where the launcher does not provide one.
#pragma once

#include <map>
#include <string>

namespace hybridflow {

struct LaunchEnv {
  std::string launcher = "single";  // "torchrun" | "mpirun" | "srun" | "single"
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 0;  // 0 = the launcher did not say
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
};

// Parses a map of environment variables; throws hybridflow::Error naming the variable that is missing or
// malformed (e.g. "RANK=abc", or RANK >= WORLD_SIZE).
LaunchEnv launch_env_from(const std::map<std::string, std::string>& env);

// The same over the real process environment.
LaunchEnv launch_env_from_environment();

// First host name of a Slurm node list in its simple forms: "a,b" -> "a", "node[01-04]" -> "node01",
// "n[3,5-7],m" -> "n3". Throws on an empty or unbalanced list.
std::string first_slurm_host(const std::string& nodelist);

}  // namespace hybridflow
