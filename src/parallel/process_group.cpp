#include "hybridflow/parallel/process_group.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/cuda.h>
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <sstream>

#include "hybridflow/core/error.h"
#include "hybridflow/core/logging.h"
#include "hybridflow/parallel/store_server.h"

namespace hybridflow {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // Gloo has no AVG: sum, then divide (see allreduce)
      return c10d::ReduceOp::SUM;
    case ReduceOp::kMax: return c10d::ReduceOp::MAX;
    case ReduceOp::kMin: return c10d::ReduceOp::MIN;
    case ReduceOp::kProduct: return c10d::ReduceOp::PRODUCT;
  }
  HF_FAIL("unknown ReduceOp ", static_cast<int>(op));
}

// How many groups of each member list this process has made, so that repeated groups of the same ranks get
// distinct store prefixes; shared by a world and all its sub-groups.
struct GroupCounters {
  std::mutex mutex;
  std::map<std::vector<int>, int> made;
};

std::string join(const std::vector<int>& ranks) {
  std::ostringstream out;
  for (size_t i = 0; i < ranks.size(); ++i) out << (i ? "," : "") << ranks[i];
  return out.str();
}

}  // namespace

struct ProcessGroup::State {
  std::shared_ptr<StoreServer> hosted_store;  // rank 0's, when it hosts the rendezvous
  c10::intrusive_ptr<c10d::Store> world_store;
  c10::intrusive_ptr<c10d::Backend> backend;
  std::string backend_name;
  int rank = 0;
  int world_rank = 0;
  std::vector<int> world_ranks;
  ProcessGroupOptions options;
  std::shared_ptr<GroupCounters> counters;
};

namespace {

std::string resolve_backend(const ProcessGroupOptions& options) {
  const std::string& b = options.backend;
  const std::string& d = options.device;
  HF_CHECK(b == "auto" || b == "gloo" || b == "nccl", "process group: backend '", b,
           "' is not one of auto, gloo, nccl");
  HF_CHECK(d == "cpu" || d == "cuda", "process group: device '", d, "' is not one of cpu, cuda");
  // Gloo moves CPU tensors, NCCL CUDA tensors; a mismatch would only fail at the first collective.
  HF_CHECK(!(b == "nccl" && d == "cpu"), "process group: backend 'nccl' needs CUDA tensors, but the device is 'cpu'; "
           "use backend gloo (or auto) with device cpu");
  HF_CHECK(!(b == "gloo" && d == "cuda"), "process group: backend 'gloo' is for CPU tensors, but the device is 'cuda'; "
           "use backend nccl (or auto) with device cuda");
  if (d == "cpu") return "gloo";
#ifdef USE_C10D_NCCL
  HF_CHECK(torch::cuda::is_available(), "process group: device 'cuda' asked for, but no CUDA device is visible");
  return "nccl";
#else
  HF_FAIL("process group: device 'cuda' needs NCCL, and this build has none: build with HF_CUDA=1 "
          "(scripts/build.sh) against a CUDA-enabled libtorch");
#endif
}

c10::intrusive_ptr<c10d::Backend> make_backend(const std::string& name, const c10::intrusive_ptr<c10d::Store>& store,
                                               int rank, int size, const ProcessGroupOptions& options) {
#ifdef USE_C10D_NCCL
  if (name == "nccl") {
    auto nccl_options = c10d::ProcessGroupNCCL::Options::create();
    nccl_options->timeout = options.timeout;
    return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, nccl_options);
  }
#endif
  auto gloo_options = c10d::ProcessGroupGloo::Options::create(options.timeout);
  gloo_options->devices.push_back(options.gloo_interface.empty()
                                      ? c10d::ProcessGroupGloo::createDeviceForHostname(options.gloo_hostname)
                                      : c10d::ProcessGroupGloo::createDeviceForInterface(options.gloo_interface));
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
}

// Each collective checks that its tensors are where the backend moves them from.
void check_device(const ProcessGroup::State& state, const at::Tensor& t, const char* op) {
  const bool want_cuda = state.backend_name == "nccl";
  HF_CHECK(t.is_cuda() == want_cuda, op, ": a ", t.device().str(), " tensor on a ", state.backend_name,
           " process group, which moves ", want_cuda ? "CUDA" : "CPU", " tensors only");
}

}  // namespace

ProcessGroup ProcessGroup::create_world(const LaunchEnv& env, const ProcessGroupOptions& options) {
  HF_CHECK(env.world_size >= 1 && env.rank >= 0 && env.rank < env.world_size, "process group: rank ", env.rank,
           " outside world of size ", env.world_size);
  HF_CHECK(env.master_port > 0 && env.master_port < 65536, "process group: master port ", env.master_port,
           " is not a TCP port");
  auto state = std::make_shared<State>();
  state->options = options;
  state->backend_name = resolve_backend(options);
  state->rank = env.rank;
  state->world_rank = env.rank;
  for (int r = 0; r < env.world_size; ++r) state->world_ranks.push_back(r);
  state->counters = std::make_shared<GroupCounters>();

  c10d::TCPStoreOptions store_options;
  store_options.port = static_cast<std::uint16_t>(env.master_port);
  // Rank 0 hosts the store through StoreServer, which listens on master_addr only: c10d's own server
  // listens on every interface, and the store has no authentication (docs/security.md).
  store_options.isServer = false;
  store_options.numWorkers = static_cast<std::size_t>(env.world_size);
  store_options.waitWorkers = false;  // the group's own rendezvous waits for everyone
  store_options.timeout = options.timeout;
  try {
    if (env.rank == 0 && options.rank0_hosts_store)
      state->hosted_store = StoreServer::start(env.master_port, options.timeout, env.master_addr);
    state->world_store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, store_options);
    state->backend = make_backend(state->backend_name, c10::make_intrusive<c10d::PrefixStore>("hf_world", state->world_store),
                                  env.rank, env.world_size, options);
  } catch (const std::exception& e) {
    HF_FAIL("process group: rendezvous of rank ", env.rank, "/", env.world_size, " at ", env.master_addr, ":",
            env.master_port, " (", state->backend_name, ") failed: ", e.what());
  }
  return ProcessGroup(state);
}

const ProcessGroup::State& ProcessGroup::state() const {
  HF_CHECK(state_ != nullptr, "process group: used an empty ProcessGroup handle");
  return *state_;
}

int ProcessGroup::rank() const { return state().rank; }
int ProcessGroup::size() const { return static_cast<int>(state().world_ranks.size()); }
int ProcessGroup::world_rank() const { return state().world_rank; }
const std::vector<int>& ProcessGroup::world_ranks() const { return state().world_ranks; }
const std::string& ProcessGroup::backend() const { return state().backend_name; }

std::string ProcessGroup::store_value(const std::string& key) const {
  const auto& store = state().world_store;
  if (!store->check({key})) return "";
  const std::vector<uint8_t> bytes = store->get(key);
  return std::string(bytes.begin(), bytes.end());
}

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks) const {
  const State& parent = state();
  HF_CHECK(!ranks.empty(), "process group: new_group with no ranks");
  std::set<int> unique(ranks.begin(), ranks.end());
  HF_CHECK(unique.size() == ranks.size(), "process group: new_group ranks [", join(ranks), "] repeat a rank");
  // Ranks are world ranks, also when called on a sub-group.
  auto pos = std::find(ranks.begin(), ranks.end(), parent.world_rank);
  HF_CHECK(pos != ranks.end(), "process group: world rank ", parent.world_rank, " called new_group([", join(ranks),
           "]) but is not a member; only members create a group");
  int index = 0;
  {
    std::lock_guard<std::mutex> lock(parent.counters->mutex);
    index = parent.counters->made[ranks]++;
  }
  auto state = std::make_shared<State>();
  state->hosted_store = parent.hosted_store;  // the server lives as long as any group that uses it
  state->world_store = parent.world_store;
  state->options = parent.options;
  state->backend_name = parent.backend_name;
  state->rank = static_cast<int>(pos - ranks.begin());
  state->world_rank = parent.world_rank;
  state->world_ranks = ranks;
  state->counters = parent.counters;
  std::string prefix = "hf_group/" + join(ranks) + "/" + std::to_string(index);
  try {
    state->backend = make_backend(state->backend_name, c10::make_intrusive<c10d::PrefixStore>(prefix, parent.world_store),
                                  state->rank, static_cast<int>(ranks.size()), parent.options);
  } catch (const std::exception& e) {
    HF_FAIL("process group: creating group [", join(ranks), "] on world rank ", parent.world_rank, " failed: ", e.what());
  }
  return ProcessGroup(state);
}

ProcessGroup ProcessGroup::split(const std::vector<std::vector<int>>& partition) const {
  const State& parent = state();
  std::set<int> seen;
  const std::vector<int>* mine = nullptr;
  for (const auto& group : partition) {
    for (int r : group) {
      HF_CHECK(seen.insert(r).second, "process group: split lists rank ", r, " twice");
      if (r == parent.world_rank) mine = &group;
    }
  }
  HF_CHECK(mine != nullptr, "process group: split does not contain world rank ", parent.world_rank);
  return new_group(*mine);
}

void ProcessGroup::allreduce(at::Tensor& tensor, ReduceOp op) const {
  HF_CHECK(op != ReduceOp::kAvg || tensor.is_floating_point(), "all_reduce AVG needs a floating tensor, got ",
           tensor.scalar_type());
  check_device(state(), tensor, "all_reduce");
  std::vector<at::Tensor> tensors{tensor};
  c10d::AllreduceOptions options;
  options.reduceOp = to_c10d(op);
  state().backend->allreduce(tensors, options)->wait();
  if (op == ReduceOp::kAvg) tensor.div_(size());
}

void ProcessGroup::allgather(std::vector<at::Tensor>& outputs, const at::Tensor& input) const {
  check_device(state(), input, "all_gather");
  std::vector<at::Tensor> inputs{input.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < size(); ++i) out[0].push_back(at::empty_like(inputs[0]));
  state().backend->allgather(out, inputs)->wait();
  outputs = std::move(out[0]);
}

void ProcessGroup::allgather_into(at::Tensor& output, const at::Tensor& input) const {
  check_device(state(), input, "all_gather_into_tensor");
  HF_CHECK(output.is_contiguous() && output.numel() == input.numel() * size() &&
               output.scalar_type() == input.scalar_type(),
           "all_gather_into_tensor: output must be contiguous with ", size(), " x ", input.numel(), " elements of ",
           input.scalar_type(), ", got ", output.numel(), " of ", output.scalar_type());
  at::Tensor in = input.contiguous();
  // _allgather_base: the name every libtorch 2.x has (newer releases call it all_gather_single and keep this
  // one as a forwarding alias).
  state().backend->_allgather_base(output, in)->wait();
}

void ProcessGroup::reduce_scatter_into(at::Tensor& output, const at::Tensor& input, ReduceOp op) const {
  check_device(state(), input, "reduce_scatter_tensor");
  HF_CHECK(output.is_contiguous() && output.numel() * size() == input.numel() &&
               output.scalar_type() == input.scalar_type(),
           "reduce_scatter_tensor: output must be contiguous with ", input.numel(), " / ", size(),
           " elements of ", input.scalar_type(), ", got ", output.numel(), " of ", output.scalar_type());
  HF_CHECK(op != ReduceOp::kAvg || input.is_floating_point(), "reduce_scatter AVG needs a floating tensor");
  at::Tensor in = input.contiguous();
  c10d::ReduceScatterOptions options;
  options.reduceOp = to_c10d(op);
  state().backend->_reduce_scatter_base(output, in, options)->wait();  // reduce_scatter_single in newer releases
  if (op == ReduceOp::kAvg) output.div_(size());
}

void ProcessGroup::alltoall_into(at::Tensor& output, const at::Tensor& input) const {
  check_device(state(), input, "all_to_all_single");
  HF_CHECK(input.dim() > 0 && input.size(0) % size() == 0, "all_to_all_single: dim 0 of size ",
           input.dim() > 0 ? input.size(0) : 0, " does not divide into ", size(), " ranks");
  HF_CHECK(output.is_contiguous() && output.sizes() == input.sizes() && output.scalar_type() == input.scalar_type(),
           "all_to_all_single: output must be contiguous of the input's shape ", input.sizes(), " and type ",
           input.scalar_type(), ", got ", output.sizes(), " of ", output.scalar_type());
  at::Tensor in = input.contiguous();
  std::vector<int64_t> equal_splits;  // empty: dim 0 split evenly over the ranks
  // alltoall_base: the name every libtorch 2.x has (newer releases call it all_to_all_single).
  state().backend->alltoall_base(output, in, equal_splits, equal_splits)->wait();
}

void ProcessGroup::alltoallv_into(at::Tensor& output, const at::Tensor& input, const std::vector<int64_t>& output_rows,
                                  const std::vector<int64_t>& input_rows) const {
  check_device(state(), input, "all_to_all_single");
  const auto n = static_cast<size_t>(size());
  HF_CHECK(input.dim() > 0 && output.dim() == input.dim() && input_rows.size() == n && output_rows.size() == n,
           "all_to_all_single: needs one row count per rank (", n, ") for input and output, got ", input_rows.size(),
           " and ", output_rows.size());
  int64_t sent = 0, received = 0;
  for (size_t j = 0; j < n; ++j) {
    sent += input_rows[j];
    received += output_rows[j];
  }
  HF_CHECK(sent == input.size(0) && received == output.size(0) && output.is_contiguous() &&
               output.scalar_type() == input.scalar_type(),
           "all_to_all_single: input of ", input.size(0), " rows and output of ", output.size(0),
           " rows (contiguous, same type) do not match the row counts ", sent, " and ", received);
  at::Tensor in = input.contiguous();
  std::vector<int64_t> out_splits = output_rows, in_splits = input_rows;
  state().backend->alltoall_base(output, in, out_splits, in_splits)->wait();
}

void ProcessGroup::broadcast(at::Tensor& tensor, int root) const {
  HF_CHECK(root >= 0 && root < size(), "broadcast: root ", root, " outside group of size ", size());
  HF_CHECK(tensor.is_contiguous(), "broadcast: tensor must be contiguous");
  check_device(state(), tensor, "broadcast");
  std::vector<at::Tensor> tensors{tensor};
  c10d::BroadcastOptions options;
  options.rootRank = root;
  state().backend->broadcast(tensors, options)->wait();
}

void ProcessGroup::barrier() const { state().backend->barrier()->wait(); }

void ProcessGroup::send(const at::Tensor& tensor, int dst, int tag) const {
  HF_CHECK(dst >= 0 && dst < size() && dst != rank(), "send: destination ", dst, " invalid in group of size ",
           size(), " from rank ", rank());
  check_device(state(), tensor, "send");
  std::vector<at::Tensor> tensors{tensor.contiguous()};
  state().backend->send(tensors, dst, tag)->wait();
}

void ProcessGroup::recv(at::Tensor& tensor, int src, int tag) const {
  HF_CHECK(src >= 0 && src < size() && src != rank(), "recv: source ", src, " invalid in group of size ", size(),
           " at rank ", rank());
  check_device(state(), tensor, "recv");
  std::vector<at::Tensor> tensors{tensor.is_contiguous() ? tensor : tensor.contiguous()};
  state().backend->recv(tensors, src, tag)->wait();
  if (!tensor.is_same(tensors[0])) tensor.copy_(tensors[0]);
}

struct ProcessGroup::PendingSend::Work {
  c10::intrusive_ptr<c10d::Work> work;
  std::vector<at::Tensor> tensors;  // kept alive until the transfer is done
};

ProcessGroup::PendingSend::PendingSend() = default;
ProcessGroup::PendingSend::PendingSend(std::unique_ptr<Work> work) : work_(std::move(work)) {}
ProcessGroup::PendingSend::PendingSend(PendingSend&&) noexcept = default;
ProcessGroup::PendingSend& ProcessGroup::PendingSend::operator=(PendingSend&& other) noexcept {
  if (this != &other) {
    try {
      wait();
    } catch (const std::exception& e) {
      log_warn("a pending send failed: ", e.what());
    }
    work_ = std::move(other.work_);
  }
  return *this;
}

ProcessGroup::PendingSend::~PendingSend() {
  try {
    wait();
  } catch (const std::exception& e) {
    log_warn("a pending send failed: ", e.what());
  }
}

void ProcessGroup::PendingSend::wait() {
  if (!work_) return;
  auto work = std::move(work_);
  work->work->wait();
}

ProcessGroup::PendingSend ProcessGroup::isend(const at::Tensor& tensor, int dst, int tag) const {
  HF_CHECK(dst >= 0 && dst < size() && dst != rank(), "isend: destination ", dst, " invalid in group of size ",
           size(), " from rank ", rank());
  check_device(state(), tensor, "isend");
  auto work = std::make_unique<PendingSend::Work>();
  work->tensors = {tensor.contiguous()};
  work->work = state().backend->send(work->tensors, dst, tag);
  return PendingSend(std::move(work));
}

}  // namespace hybridflow
