// DataProto: the batch that flows between the controller and worker groups. Named tensors that all
// share dim 0 (the batch), per-sample non-tensor fields (prompt text, ground truth, ...) and meta info.
// Every operation keeps rows of tensors and fields aligned, so a sample never loses its prompt.
#pragma once

#include <torch/types.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace hybridflow {

// A view of bytes received from somewhere; `owner` keeps them alive for as long as a tensor uses them.
struct Buffer {
  const void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> owner;
};

class DataProto {
 public:
  int64_t batch_size() const;  // 0 when empty
  bool empty() const { return tensors_.empty() && fields_.empty(); }

  // The first tensor or field of an empty DataProto sets the batch size; later ones must match it.
  void set_tensor(const std::string& key, torch::Tensor t);
  const torch::Tensor& tensor(const std::string& key) const;  // unknown key -> Error naming available keys
  bool has_tensor(const std::string& key) const;
  const std::map<std::string, torch::Tensor>& tensors() const { return tensors_; }
  void erase_tensor(const std::string& key);

  void set_field(const std::string& key, std::vector<nlohmann::json> values);
  const std::vector<nlohmann::json>& field(const std::string& key) const;
  bool has_field(const std::string& key) const;
  const std::map<std::string, std::vector<nlohmann::json>>& fields() const { return fields_; }
  void erase_field(const std::string& key);

  nlohmann::json& meta() { return meta_; }
  const nlohmann::json& meta() const { return meta_; }

  // Row operations. Tensors of the results may be views of this one's (slice, chunk); meta is copied.
  std::vector<DataProto> chunk(int64_t n) const;  // batch must divide by n, else Error (say how to pad)
  DataProto padded_to_multiple(int64_t n, int64_t* pad_count) const;  // pads by repeating leading rows
  DataProto slice(int64_t begin, int64_t end) const;                    // rows [begin, end)
  DataProto index_select(const torch::Tensor& indices) const;           // 1-D integer row indices
  DataProto select(const std::vector<std::string>& tensor_keys,
                   const std::vector<std::string>& field_keys = {}) const;
  DataProto repeat(int64_t times, bool interleave = true) const;  // interleave: a a b b; else a b a b
  static DataProto concat(const std::vector<DataProto>& parts);   // keys must match, meta from first
  // Union of keys. A key present in both must hold equal content; batch sizes must match.
  // Meta keys are merged the same way.
  DataProto& update(const DataProto& other);
  static DataProto union_of(const DataProto& a, const DataProto& b);

  // Same batch with every tensor on `device` (tensors already there are shared, not copied).
  DataProto to(const torch::Device& device) const;
  // One line for logs and error messages: "DataProto(batch 4; tensors: x float32[4, 2]; fields: prompt; meta: step)".
  std::string summary() const;

  // Serialization between processes. to_frames: a small JSON header (keys, dtypes, shapes, fields, meta)
  // plus one contiguous CPU tensor per payload, so a messaging layer can send tensor bytes without copying.
  struct Frames {
    std::string header;
    std::vector<torch::Tensor> payloads;
  };
  Frames to_frames() const;
  // Zero-copy: tensors view the buffers (keeping their owners alive) unless a buffer is misaligned for
  // its dtype, in which case that one payload is copied.
  static DataProto from_frames(const std::string& header, const std::vector<Buffer>& payloads);

  // One buffer: magic, version, header length, header, then each payload at a 64-byte aligned offset.
  std::string serialize() const;
  // Malformed or truncated input -> Error, never an out-of-bounds read. The const& overload copies the
  // bytes once; the && overload takes them over, and the tensors view them in place.
  static DataProto deserialize(const std::string& bytes);
  static DataProto deserialize(std::string&& bytes);

 private:
  void check_rows(const std::string& what, const std::string& key, int64_t rows, bool replacing) const;

  int64_t batch_size_ = 0;
  std::map<std::string, torch::Tensor> tensors_;
  std::map<std::string, std::vector<nlohmann::json>> fields_;
  nlohmann::json meta_ = nlohmann::json::object();
};

// Human-readable name of a supported dtype ("float32", "bfloat16", ...); Error for others.
std::string dtype_name(c10::ScalarType dtype);
c10::ScalarType dtype_from_name(const std::string& name);  // Error naming the supported ones

}  // namespace hybridflow
