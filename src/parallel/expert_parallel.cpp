#include "hybridflow/parallel/expert_parallel.h"

#include <ATen/ATen.h>

#include "hybridflow/core/error.h"
#include "parallel/collective_function.h"

namespace hybridflow {
namespace {

using collective_autograd::AutogradContext;
using collective_autograd::variable_list;

struct ExchangeRows : torch::autograd::Function<ExchangeRows> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, Communicator* comm,
                            const std::vector<int64_t>& send_rows, const std::vector<int64_t>& recv_rows) {
    // The counts travel through the graph as integer lists.
    collective_autograd::save_comm(ctx, comm);
    ctx->saved_data["ep_send"] = c10::List<int64_t>(send_rows);
    ctx->saved_data["ep_recv"] = c10::List<int64_t>(recv_rows);
    return comm->all_to_all(x.contiguous(), send_rows, recv_rows);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    Communicator& comm = collective_autograd::saved_comm(ctx);
    const auto send_rows = ctx->saved_data["ep_send"].toIntVector();
    const auto recv_rows = ctx->saved_data["ep_recv"].toIntVector();
    // What came from rank i goes back to rank i.
    return {comm.all_to_all(grads[0].contiguous(), recv_rows, send_rows), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

std::vector<int64_t> exchange_counts(const std::vector<int64_t>& send, const ExpertParallelGroup& ep) {
  HF_CHECK(!send.empty() && send.size() % static_cast<size_t>(ep.size()) == 0, "expert parallelism: ", send.size(),
           " counts do not split over a group of ", ep.size());
  if (!ep.enabled()) return send;
  auto counts = at::tensor(send, at::kLong);
  // NCCL moves CUDA tensors only (this process's current device).
  if (ep.comm()->group().backend() == "nccl") counts = counts.to(at::Device(at::kCUDA));
  auto received = ep.comm()->all_to_all(counts).to(at::kCPU);
  return std::vector<int64_t>(received.data_ptr<int64_t>(), received.data_ptr<int64_t>() + received.numel());
}

at::Tensor exchange_rows(const at::Tensor& x, const std::vector<int64_t>& send_rows,
                         const std::vector<int64_t>& recv_rows, const ExpertParallelGroup& ep) {
  if (!ep.enabled()) return x;
  HF_CHECK(x.dim() >= 1, "exchange_rows: needs [rows, ...], got a scalar");
  return ExchangeRows::apply(x, ep.comm(), send_rows, recv_rows);
}

}  // namespace hybridflow
