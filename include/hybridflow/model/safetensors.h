// Hugging Face safetensors files, read and written without the Rust library: an 8-byte
// little-endian header length N, N bytes of JSON header (space padded), then one byte buffer that
// the tensors tile exactly. Readers must not trust the header, so every field is checked against
// the file before a byte is copied.
#pragma once

#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hybridflow {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

struct SafetensorsFile {
  NamedTensors tensors;                         // in file order (by data offset)
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"
};

// Tensors own their memory (CPU). Throws hybridflow::Error naming `path` and the problem for any
// malformed file. Dtypes: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL.
SafetensorsFile read_safetensors(const std::string& path);
// Same checks, but the tensors are views of the file mapped into memory (copy-on-write), read from disk
// only where they are touched: copying one slice of a tensor reads that slice's pages. The mapping lives
// as long as any of the tensors.
SafetensorsFile map_safetensors(const std::string& path);
// Same, from bytes already in memory; `name` is used in error messages.
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& name);

// Writes tensors (any device, made contiguous on CPU) in the given order, header aligned to 8
// bytes as Hugging Face writers do; atomic (temp file + rename). Duplicate names are an Error.
void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata = {});
std::string serialize_safetensors(const NamedTensors& tensors,
                                  const std::map<std::string, std::string>& metadata = {});

// "F32" <-> torch::kFloat32 etc.; unknown names/dtypes throw.
torch::Dtype safetensors_dtype(const std::string& name);
std::string safetensors_dtype_name(torch::Dtype dtype);

}  // namespace hybridflow
