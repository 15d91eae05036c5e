// How many worker processes of a run share one host, and so its GPUs: each takes the GPU of its
// LOCAL_RANK, and NCCL refuses a group with two ranks on one device (core/platform.h,
// device_for_processes, decides what a run with too few GPUs does).
#pragma once

#include <cstdint>

#include "hybridflow/parallel/launch_env.h"
#include "hybridflow/placement/placement_spec.h"

namespace hybridflow {

// Spawned by the controller ("single" launcher), every pool's processes run on this host, or spread over
// `nnodes` hosts (trainer.nnodes). Under torchrun, mpirun or srun the launcher's local world size counts
// them; the controller (rank 0) takes no GPU, so in a single-node launch its slot does not count. 0 when
// the launcher does not give its local world size.
int workers_per_host(const RolePlacement& placement, int64_t nnodes, const LaunchEnv& env);

}  // namespace hybridflow
