// Entry point of a worker process. A controller spawns workers by exec'ing a binary (by default its
// own) with HF_WORKER_ENDPOINT / HF_WORKER_TOKEN / HF_WORKER_RANK / HF_WORKER_POOL set; that binary
// must reach run_worker_if_requested() before doing anything else (first thing in main, or from a
// static initializer placed after its HF_REGISTER_WORKER lines).
#pragma once

namespace hybridflow {

// HF_WORKER_RANK_COUNT=n (optional): this one process serves ranks HF_WORKER_RANK .. HF_WORKER_RANK + n - 1,
// each on threads of its own with its own connection, key state and executor: simulated workers, so that
// the controller's cost of reaching many ranks (the real messages, each authenticated) can be measured
// with more ranks than this machine has memory for processes. Such ranks share a crash and a process, and a
// one-to-all call reaches them as one message per process (ResourcePool::batch_calls, runtime/rank_batch.h),
// and they send one heartbeat per process, naming the ranks whose threads are alive (RankDirectory::beat).
inline constexpr const char* kWorkerRankCountEnv = "HF_WORKER_RANK_COUNT";

// Connects to the controller and serves create/call requests until told to shut down.
// Returns the process exit code. Error when the environment contract is missing.
int run_worker_main(int argc, char** argv);

// When the worker environment is set, or this process is a worker rank of a multi-rank launch
// (torchrun / mpirun / srun, see launcher.h): runs the worker and terminates the process with its exit
// code (never returns). Otherwise returns false at once; the controller rank of a launch starts
// listening for its worker ranks first. A malformed launch environment ends the process (code 1).
bool run_worker_if_requested();

}  // namespace hybridflow
