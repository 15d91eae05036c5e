#include "hybridflow/parallel/gather_named.h"

#include <ATen/ATen.h>

#include <cstring>

#include <nlohmann/json.hpp>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

constexpr int kSizesTag = 11;
constexpr int kHeaderTag = 12;
constexpr int kDataTag = 13;

}  // namespace

std::map<std::string, at::Tensor> gather_named_tensors(const std::map<std::string, at::Tensor>& mine,
                                                       Communicator& group, int root, c10::Device device) {
  const auto on = at::TensorOptions().device(device);
  if (group.rank() != root) {
    // [header bytes, data elements], then the header (names and shapes as JSON), then the data, flat.
    nlohmann::json header = nlohmann::json::array();
    std::vector<at::Tensor> flat;
    for (const auto& [name, tensor] : mine) {
      HF_CHECK(tensor.scalar_type() == at::kFloat, "gather_named_tensors: '", name, "' is ", tensor.scalar_type(),
               ", expected float32");
      header.push_back({{"name", name}, {"shape", tensor.sizes().vec()}});
      flat.push_back(tensor.reshape({-1}).to(device));
    }
    const std::string text = header.dump();
    at::Tensor data = flat.empty() ? at::empty({0}, on.dtype(at::kFloat)) : at::cat(flat);
    at::Tensor sizes = at::tensor({static_cast<int64_t>(text.size()), data.numel()}, at::kLong).to(device);
    group.send(sizes, root, kSizesTag);
    at::Tensor bytes = at::empty({static_cast<int64_t>(text.size())}, at::kByte);
    std::memcpy(bytes.data_ptr(), text.data(), text.size());
    group.send(bytes.to(device), root, kHeaderTag);
    group.send(data, root, kDataTag);
    return {};
  }
  std::map<std::string, at::Tensor> out;
  for (int r = 0; r < group.size(); ++r) {
    if (r == root) {
      for (const auto& [name, tensor] : mine) out.emplace(name, tensor.to(at::kCPU));
      continue;
    }
    at::Tensor sizes = at::empty({2}, on.dtype(at::kLong));
    group.recv(sizes, r, kSizesTag);
    sizes = sizes.cpu();
    at::Tensor bytes = at::empty({sizes[0].item<int64_t>()}, on.dtype(at::kByte));
    group.recv(bytes, r, kHeaderTag);
    bytes = bytes.cpu();
    at::Tensor data = at::empty({sizes[1].item<int64_t>()}, on.dtype(at::kFloat));
    group.recv(data, r, kDataTag);
    data = data.cpu();
    const auto header = nlohmann::json::parse(std::string(static_cast<const char*>(bytes.data_ptr()), bytes.numel()));
    int64_t offset = 0;
    for (const auto& entry : header) {
      const auto shape = entry.at("shape").get<std::vector<int64_t>>();
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      HF_CHECK(offset + numel <= data.numel(), "gather_named_tensors: rank ", r, " sent ", data.numel(),
               " elements, fewer than its header describes");
      // The lower rank's copy of a name both hold wins (emplace keeps the first).
      out.emplace(entry.at("name").get<std::string>(), data.narrow(0, offset, numel).view(shape).clone());
      offset += numel;
    }
  }
  return out;
}

}  // namespace hybridflow
