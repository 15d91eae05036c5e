#include "hybridflow/workers/sequence_parallel_rows.h"

#include "hybridflow/core/error.h"
#include "hybridflow/parallel/device_mesh.h"

namespace hybridflow {
namespace {

// Collectives run where the backend needs them: Gloo on host tensors, NCCL on the current CUDA device.
torch::Device collective_device(const Communicator& comm) {
  return comm.group().backend() == "nccl" ? torch::Device(torch::kCUDA) : torch::Device(torch::kCPU);
}

// Turns sequence parallelism on in the models for a scope, and off at its end (also when the call throws).
class SequenceParallelScope {
 public:
  SequenceParallelScope(const std::vector<CausalLM*>& models, SequenceParallelGroup group) : models_(models) {
    for (CausalLM* model : models_) (*model)->set_sequence_parallel(group);
  }
  ~SequenceParallelScope() {
    for (CausalLM* model : models_) (*model)->set_sequence_parallel({});
  }
  SequenceParallelScope(const SequenceParallelScope&) = delete;
  SequenceParallelScope& operator=(const SequenceParallelScope&) = delete;

 private:
  std::vector<CausalLM*> models_;
};

}  // namespace

std::unique_ptr<SequenceParallelRows> SequenceParallelRows::join(const ProcessGroup& world, const MeshCoord& coord,
                                                                 int size, const std::string& key) {
  HF_CHECK(size >= 1, key, " must be >= 1, got ", size);
  if (size == 1) return nullptr;
  HF_CHECK(coord.dp_size % size == 0, key, " = ", size, " does not divide the role's ", coord.dp_size,
           " data-parallel ranks (", world.size(), " processes over tensor_model_parallel_size ", coord.tp_size,
           " and pipeline_model_parallel_size ", coord.pp_size, ")");
  // Groups of `size` consecutive data-parallel ranks within each (pipeline stage, tensor rank): the members of
  // a tensor-parallel group share their sequence slice, and a stage's slice goes to the same slice's next stage.
  const DeviceMesh mesh(coord.pp_size, coord.dp_size, coord.tp_size);
  std::unique_ptr<SequenceParallelRows> rows(new SequenceParallelRows());
  rows->comm_ = std::make_unique<Communicator>(world.split(mesh.dp_blocks(size, /*with_tensor_ranks=*/false)));
  return rows;
}

DataProto SequenceParallelRows::gather(const DataProto& mine) const {
  const torch::Device device = collective_device(*comm_);
  DataProto out;
  for (const auto& [key, tensor] : mine.tensors()) {
    // The members' shapes first: the gather needs equal ones, and a mismatch must be an error, not a hang.
    auto shape = torch::tensor(tensor.sizes().vec(), torch::kLong).to(device);
    auto shapes = comm_->all_gather_cat(shape.unsqueeze(0), 0).cpu();
    HF_CHECK(shapes.eq(shapes[0]).all().item<bool>(), "ulysses_sequence_parallel_size ", size(), ": tensor '", key,
             "' has shapes ", shapes, " on the ranks of one sequence-parallel group; each needs as many rows of ",
             "the same widths (a batch that divides evenly over the role's processes)");
    out.set_tensor(key, comm_->all_gather_cat(tensor.to(device).contiguous(), 0).to(tensor.device()));
  }
  out.meta() = mine.meta();
  return out;
}

DataProto SequenceParallelRows::own_share(const DataProto& group_result, int64_t group_rows) const {
  const int64_t share = group_rows / size();
  DataProto out;
  for (const auto& [key, tensor] : group_result.tensors())
    out.set_tensor(key, tensor.dim() > 0 && tensor.size(0) == group_rows
                            ? tensor.narrow(0, comm_->rank() * share, share).contiguous()
                            : tensor);
  out.meta() = group_result.meta();
  return out;
}

DataProto on_sequence_parallel_rows(const SequenceParallelRows* rows, const std::vector<CausalLM*>& models,
                                    const DataProto& in, const std::function<DataProto(const DataProto&)>& call) {
  if (rows == nullptr) return call(in);
  const DataProto group_rows = rows->gather(in);
  DataProto result;
  {
    SequenceParallelScope scope(models, rows->group());
    result = call(group_rows);
  }
  return rows->own_share(result, group_rows.batch_size());
}

DataProto update_on_sequence_parallel_rows(const SequenceParallelRows* rows, const std::vector<CausalLM*>& models,
                                           const DataProto& in, const std::string& prefix,
                                           const std::function<DataProto(const DataProto&)>& call) {
  if (rows == nullptr) return call(in);
  const int64_t before = rows->all_to_all_bytes();
  DataProto out = on_sequence_parallel_rows(rows, models, in, call);
  if (out.meta().contains("metrics"))
    out.meta()["metrics"][prefix + "sequence_parallel_all_to_all_mb"] =
        static_cast<double>(rows->all_to_all_bytes() - before) / 1e6;
  return out;
}

}  // namespace hybridflow
