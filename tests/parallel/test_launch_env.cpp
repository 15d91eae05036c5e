#include "hybridflow/parallel/launch_env.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

using ::testing::HasSubstr;

std::string error_of(const std::map<std::string, std::string>& env) {
  try {
    launch_env_from(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchEnv, NoLauncherIsSingleProcess) {
  LaunchEnv env = launch_env_from({});
  EXPECT_EQ(env.launcher, "single");
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv env = launch_env_from({{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"},
                                   {"LOCAL_WORLD_SIZE", "2"}, {"MASTER_ADDR", "10.0.0.5"}, {"MASTER_PORT", "1234"}});
  EXPECT_EQ(env.launcher, "torchrun");
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.5");
  EXPECT_EQ(env.master_port, 1234);
}

TEST(LaunchEnv, TorchrunErrorsNameTheVariable) {
  std::map<std::string, std::string> good{{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"},
                                          {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29501"}};
  auto with = [&](const std::string& key, const std::string& value) {
    auto env = good;
    env[key] = value;
    return error_of(env);
  };
  EXPECT_THAT(with("RANK", "abc"), HasSubstr("RANK=abc is not an integer"));
  EXPECT_THAT(with("RANK", "2"), HasSubstr("RANK=2 must be in [0, WORLD_SIZE=2)"));
  EXPECT_THAT(with("WORLD_SIZE", "0"), HasSubstr("WORLD_SIZE=0 must be >= 1"));
  EXPECT_THAT(with("MASTER_PORT", "70000"), HasSubstr("MASTER_PORT=70000 is not a TCP port"));
  EXPECT_THAT(with("LOCAL_RANK", "1x"), HasSubstr("LOCAL_RANK=1x"));
  auto missing = good;
  missing.erase("MASTER_ADDR");
  EXPECT_THAT(error_of(missing), HasSubstr("MASTER_ADDR is not set"));
  missing = good;
  missing.erase("LOCAL_RANK");
  EXPECT_THAT(error_of(missing), HasSubstr("LOCAL_RANK is not set"));
}

TEST(LaunchEnv, Mpirun) {
  LaunchEnv env = launch_env_from({{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "6"},
                                   {"OMPI_COMM_WORLD_LOCAL_RANK", "2"}, {"HF_MASTER_ADDR", "head"},
                                   {"HF_MASTER_PORT", "4000"}});
  EXPECT_EQ(env.launcher, "mpirun");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 6);
  EXPECT_EQ(env.local_rank, 2);
  EXPECT_EQ(env.master_addr, "head");
  EXPECT_EQ(env.master_port, 4000);
  // MASTER_ADDR wins over HF_MASTER_ADDR; the port defaults to torchrun's.
  env = launch_env_from({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"},
                         {"HF_MASTER_ADDR", "other"}});
  EXPECT_EQ(env.master_addr, "m");
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}}),
              HasSubstr("HF_MASTER_ADDR"));
  EXPECT_THAT(error_of({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "m"}}),
              HasSubstr("OMPI_COMM_WORLD_RANK=4 must be in [0, OMPI_COMM_WORLD_SIZE=2)"));
}

TEST(LaunchEnv, Srun) {
  LaunchEnv env = launch_env_from({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "1"},
                                   {"SLURM_JOB_NODELIST", "gpu[07-10],cpu1"}});
  EXPECT_EQ(env.launcher, "srun");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.master_addr, "gpu07");
  env = launch_env_from({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_LAUNCH_NODE_IPADDR", "10.1.1.1"},
                         {"SLURM_JOB_NODELIST", "a,b"}, {"MASTER_PORT", "777"}});
  EXPECT_EQ(env.master_addr, "10.1.1.1");
  EXPECT_EQ(env.master_port, 777);
  EXPECT_THAT(error_of({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}}), HasSubstr("SLURM_JOB_NODELIST"));
  EXPECT_THAT(error_of({{"SLURM_PROCID", "x"}, {"SLURM_NTASKS", "2"}}), HasSubstr("SLURM_PROCID=x"));
  // salloc without srun: no task id, so not a rank.
  EXPECT_EQ(launch_env_from({{"SLURM_NTASKS", "4"}}).launcher, "single");
}

TEST(LaunchEnv, SlurmNodeLists) {
  EXPECT_EQ(first_slurm_host("a,b"), "a");
  EXPECT_EQ(first_slurm_host("node[01-04]"), "node01");
  EXPECT_EQ(first_slurm_host("n[3,5-7],m"), "n3");
  EXPECT_EQ(first_slurm_host("rack[2-3]-gpu"), "rack2-gpu");
  EXPECT_EQ(first_slurm_host("solo"), "solo");
  EXPECT_THROW(first_slurm_host(""), Error);
  EXPECT_THROW(first_slurm_host("n[1-2"), Error);
}

}  // namespace
}  // namespace hybridflow
