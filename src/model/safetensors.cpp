#include "hybridflow/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <memory>

#include <algorithm>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "hybridflow/core/error.h"
#include "hybridflow/core/fs.h"

namespace hybridflow {
namespace {

using json = nlohmann::json;

constexpr char kMetadataKey[] = "__metadata__";
// Guards against absurd headers before any allocation (the Rust reader uses 100 MB too).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DtypeName {
  const char* name;
  torch::Dtype dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", torch::kFloat64}, {"F32", torch::kFloat32}, {"F16", torch::kFloat16},
    {"BF16", torch::kBFloat16}, {"I64", torch::kInt64}, {"I32", torch::kInt32},
    {"I16", torch::kInt16},    {"I8", torch::kInt8},     {"U8", torch::kUInt8},
    {"BOOL", torch::kBool},
};

struct Entry {
  std::string name;
  torch::Dtype dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

struct Layout {
  std::map<std::string, std::string> metadata;
  std::vector<Entry> entries;  // sorted by offset
  uint64_t data_start = 0;     // file offset of the data buffer
};

uint64_t read_u64_le(const char* bytes) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(bytes[i]);
  return v;
}

std::string u64_le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

// Parses the header, refusing duplicate top-level names (nlohmann would keep the last silently).
json parse_header(const std::string& text, const std::string& file) {
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second && duplicate.empty()) duplicate = key;
    }
    return true;
  };
  json header;
  try {
    header = json::parse(text, on_event);
  } catch (const json::exception& e) {
    HF_FAIL(file, ": safetensors header is not valid JSON: ", e.what());
  }
  HF_CHECK(duplicate.empty(), file, ": safetensors header names tensor '", duplicate, "' twice");
  HF_CHECK(header.is_object(), file, ": safetensors header must be a JSON object, got ", header.type_name());
  return header;
}

uint64_t non_negative_int(const json& v, const std::string& file, const std::string& what) {
  HF_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0), file, ": ", what,
           " must be a non-negative integer, got ", v.dump());
  return v.get<uint64_t>();
}

Entry parse_entry(const std::string& name, const json& spec, const std::string& file) {
  const std::string where = "tensor '" + name + "'";
  HF_CHECK(spec.is_object(), file, ": ", where, " must be an object with dtype, shape, data_offsets");
  for (const char* field : {"dtype", "shape", "data_offsets"})
    HF_CHECK(spec.contains(field), file, ": ", where, " is missing field '", field, "'");
  Entry e;
  e.name = name;
  HF_CHECK(spec["dtype"].is_string(), file, ": ", where, " dtype must be a string");
  const std::string dtype = spec["dtype"].get<std::string>();
  try {
    e.dtype = safetensors_dtype(dtype);
  } catch (const Error&) {
    HF_FAIL(file, ": ", where, " has unknown dtype '", dtype, "' (supported: F64 F32 F16 BF16 I64 I32 I16 I8 U8 BOOL)");
  }
  const json& shape = spec["shape"];
  HF_CHECK(shape.is_array(), file, ": ", where, " shape must be an array");
  // Byte size computed with overflow checks: a hostile shape must not wrap around to a small size.
  uint64_t bytes = static_cast<uint64_t>(c10::elementSize(e.dtype));
  for (const json& dim : shape) {
    uint64_t d = non_negative_int(dim, file, where + " shape entry");
    HF_CHECK(d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()), file, ": ", where, " dimension too large");
    HF_CHECK(d == 0 || bytes <= std::numeric_limits<uint64_t>::max() / d, file, ": ", where, " shape overflows");
    bytes *= d;
    e.shape.push_back(static_cast<int64_t>(d));
  }
  const json& offsets = spec["data_offsets"];
  HF_CHECK(offsets.is_array() && offsets.size() == 2, file, ": ", where, " data_offsets must be [begin, end]");
  e.begin = non_negative_int(offsets[0], file, where + " data_offsets begin");
  e.end = non_negative_int(offsets[1], file, where + " data_offsets end");
  HF_CHECK(e.begin <= e.end, file, ": ", where, " data_offsets [", e.begin, ", ", e.end, "] has begin > end");
  HF_CHECK(e.end - e.begin == bytes, file, ": ", where, " of dtype ", dtype, " and shape ", shape.dump(), " needs ",
           bytes, " bytes but data_offsets [", e.begin, ", ", e.end, "] span ", e.end - e.begin);
  return e;
}

}  // namespace

torch::Dtype safetensors_dtype(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.dtype;
  HF_FAIL("unknown safetensors dtype '", name, "'");
}

std::string safetensors_dtype_name(torch::Dtype dtype) {
  for (const auto& d : kDtypes)
    if (dtype == d.dtype) return d.name;
  HF_FAIL("dtype ", c10::toString(dtype), " cannot be stored in safetensors");
}

namespace {

// The header of a file of `size` bytes at `bytes`, checked against the file: every tensor's offsets tile
// the data buffer exactly.
Layout parse_layout(const char* bytes, uint64_t size, const std::string& file) {
  HF_CHECK(size >= 8, file, ": not a safetensors file: ", size, " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = read_u64_le(bytes);
  const uint64_t available = size - 8;
  HF_CHECK(header_len <= available, file, ": safetensors header length ", header_len,
           " runs past the end of the file (", available, " bytes after the length; truncated or not safetensors)");
  HF_CHECK(header_len <= kMaxHeaderBytes, file, ": safetensors header length ", header_len, " exceeds the ",
           kMaxHeaderBytes, "-byte limit (real headers are kilobytes; not a safetensors file?)");
  json header = parse_header(std::string(bytes + 8, static_cast<size_t>(header_len)), file);
  Layout layout;
  layout.data_start = 8 + header_len;
  const uint64_t data_len = size - layout.data_start;
  auto& out = layout;
  auto& entries = layout.entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == kMetadataKey) {
      HF_CHECK(it.value().is_object(), file, ": __metadata__ must be an object of strings");
      for (auto m = it.value().begin(); m != it.value().end(); ++m) {
        HF_CHECK(m.value().is_string(), file, ": __metadata__ value for '", m.key(), "' must be a string, got ",
                 m.value().dump());
        out.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(it.key(), it.value(), file));
  }

  // The tensors must tile the buffer exactly: no gaps (hidden data), no overlaps (aliasing), no tail.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  std::string previous = "start of the data buffer";
  for (const Entry& e : entries) {
    HF_CHECK(e.end <= data_len, file, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end,
             "] out of range: data buffer has ", data_len, " bytes (file truncated?)");
    HF_CHECK(e.begin >= cursor, file, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end,
             "] overlap the previous tensor (", previous, " ends at ", cursor, ")");
    HF_CHECK(e.begin == cursor, file, ": tensor '", e.name, "' starts at ", e.begin, " but ", previous,
             " ends at ", cursor, ": offsets must be contiguous (gap of ", e.begin - cursor, " bytes)");
    cursor = e.end;
    previous = "tensor '" + e.name + "'";
  }
  HF_CHECK(cursor == data_len, file, ": data buffer has ", data_len, " bytes but the tensors cover only ", cursor,
           " (trailing bytes after ", previous, ")");

  return layout;
}

}  // namespace

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& file) {
  Layout layout = parse_layout(bytes.data(), bytes.size(), file);
  SafetensorsFile out;
  out.metadata = std::move(layout.metadata);
  for (const Entry& e : layout.entries) {
    torch::Tensor t = torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    if (e.end > e.begin) std::memcpy(t.data_ptr(), bytes.data() + layout.data_start + e.begin, e.end - e.begin);
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}

SafetensorsFile map_safetensors(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  HF_CHECK(fd >= 0, path, ": cannot open: ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    HF_FAIL(path, ": cannot stat: ", std::strerror(err));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* data = size > 0 ? ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0) : nullptr;
  const int err = errno;
  ::close(fd);
  HF_CHECK(size == 0 || data != MAP_FAILED, path, ": cannot map: ", std::strerror(err));
  // The mapping lives while any tensor views it.
  std::shared_ptr<void> mapping(data, [size](void* p) {
    if (p != nullptr) ::munmap(p, size);
  });
  Layout layout = parse_layout(static_cast<const char*>(data), size, path);
  SafetensorsFile out;
  out.metadata = std::move(layout.metadata);
  for (const Entry& e : layout.entries) {
    char* begin = static_cast<char*>(data) + layout.data_start + e.begin;
    torch::Tensor t = e.end > e.begin
                          ? torch::from_blob(begin, e.shape, [mapping](void*) {}, torch::TensorOptions().dtype(e.dtype))
                          : torch::empty(e.shape, torch::TensorOptions().dtype(e.dtype));
    out.tensors.emplace_back(e.name, std::move(t));
  }
  return out;
}



SafetensorsFile read_safetensors(const std::string& path) { return parse_safetensors(read_file(path), path); }

std::string serialize_safetensors(const NamedTensors& tensors, const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header[kMetadataKey] = metadata;
  std::vector<torch::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    HF_CHECK(name != kMetadataKey, "safetensors: a tensor cannot be named ", kMetadataKey);
    HF_CHECK(!header.contains(name), "safetensors: tensor name '", name, "' given twice");
    HF_CHECK(tensor.defined(), "safetensors: tensor '", name, "' is undefined");
    torch::Tensor t = tensor.detach().to(torch::kCPU).contiguous();
    const uint64_t nbytes = static_cast<uint64_t>(t.numel()) * t.element_size();
    header[name] = {{"dtype", safetensors_dtype_name(t.scalar_type())},
                    {"shape", t.sizes().vec()},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
    data.push_back(std::move(t));
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');  // data starts 8-byte aligned
  std::string out = u64_le(text.size()) + text;
  out.reserve(out.size() + offset);
  for (const auto& t : data)
    if (t.numel() > 0)
      out.append(static_cast<const char*>(t.data_ptr()), static_cast<size_t>(t.numel()) * t.element_size());
  return out;
}

void write_safetensors(const std::string& path, const NamedTensors& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::string bytes;
  try {
    bytes = serialize_safetensors(tensors, metadata);
  } catch (const Error& e) {
    HF_FAIL(path, ": ", e.what());
  }
  write_file_atomic(path, bytes);
}

}  // namespace hybridflow
