#include "hybridflow/core/data_proto.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "hybridflow/core/error.h"

namespace hybridflow {

namespace {

using json = nlohmann::json;

struct DtypeInfo {
  c10::ScalarType type;
  const char* name;
};

constexpr DtypeInfo kDtypes[] = {
    {c10::kFloat, "float32"}, {c10::kHalf, "float16"}, {c10::kBFloat16, "bfloat16"},
    {c10::kDouble, "float64"}, {c10::kLong, "int64"},  {c10::kInt, "int32"},
    {c10::kChar, "int8"},      {c10::kByte, "uint8"},  {c10::kBool, "bool"},
};

std::string supported_dtype_names() {
  std::string out;
  for (const auto& d : kDtypes) out += std::string(out.empty() ? "" : ", ") + d.name;
  return out;
}

template <typename Map>
std::string key_list(const Map& map) {
  std::string out;
  for (const auto& kv : map) out += (out.empty() ? "" : ", ") + kv.first;
  return out.empty() ? "(none)" : out;
}

std::string shape_string(const torch::Tensor& t) {
  std::ostringstream out;
  out << t.sizes();
  return out.str();
}

// Serialized layout: "HFDP" | u32 version | u64 header length | header | payloads at 64-aligned offsets.
constexpr char kMagic[4] = {'H', 'F', 'D', 'P'};
constexpr uint32_t kVersion = 1;
constexpr size_t kPrefixBytes = 4 + 4 + 8;
constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

torch::Tensor gather_rows(const torch::Tensor& t, const torch::Tensor& rows) {
  return t.index_select(0, rows.to(t.device()));
}

std::vector<json> gather_rows(const std::vector<json>& values, const std::vector<int64_t>& rows) {
  std::vector<json> out;
  out.reserve(rows.size());
  for (int64_t r : rows) out.push_back(values[static_cast<size_t>(r)]);
  return out;
}

// Merges `from` into `into`: a key in both must have equal values.
void merge_meta(json& into, const json& from) {
  if (from.is_null()) return;
  HF_CHECK(into.is_object() && from.is_object(), "DataProto::update: meta must be JSON objects");
  for (auto it = from.begin(); it != from.end(); ++it) {
    auto mine = into.find(it.key());
    if (mine == into.end()) {
      into[it.key()] = it.value();
    } else {
      HF_CHECK(*mine == it.value(), "DataProto::update: meta key '", it.key(), "' differs: ", mine->dump(),
               " vs ", it.value().dump());
    }
  }
}

}  // namespace

std::string dtype_name(c10::ScalarType dtype) {
  for (const auto& d : kDtypes)
    if (d.type == dtype) return d.name;
  HF_FAIL("unsupported tensor dtype ", c10::toString(dtype), "; supported: ", supported_dtype_names());
}

c10::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& d : kDtypes)
    if (name == d.name) return d.type;
  HF_FAIL("unknown tensor dtype '", name, "'; supported: ", supported_dtype_names());
}

int64_t DataProto::batch_size() const { return empty() ? 0 : batch_size_; }

void DataProto::check_rows(const std::string& what, const std::string& key, int64_t rows, bool replacing) const {
  // Replacing the only entry may change the batch size; otherwise every entry must agree.
  size_t others = tensors_.size() + fields_.size() - (replacing ? 1 : 0);
  if (others == 0) return;
  HF_CHECK(rows == batch_size_, "DataProto: ", what, " '", key, "' has ", rows, " rows but the batch has ",
           batch_size_, " (keys: tensors [", key_list(tensors_), "], fields [", key_list(fields_), "])");
}

void DataProto::set_tensor(const std::string& key, torch::Tensor t) {
  HF_CHECK(t.defined(), "DataProto::set_tensor: tensor '", key, "' is undefined");
  HF_CHECK(t.dim() >= 1, "DataProto::set_tensor: tensor '", key,
           "' is a scalar; tensors need a batch dimension (dim 0)");
  dtype_name(t.scalar_type());  // rejects dtypes that cannot be serialized
  check_rows("tensor", key, t.size(0), tensors_.count(key) > 0);
  batch_size_ = t.size(0);
  tensors_[key] = std::move(t);
}

const torch::Tensor& DataProto::tensor(const std::string& key) const {
  auto it = tensors_.find(key);
  HF_CHECK(it != tensors_.end(), "DataProto: no tensor '", key, "'; available tensors: ", key_list(tensors_));
  return it->second;
}

bool DataProto::has_tensor(const std::string& key) const { return tensors_.count(key) > 0; }

void DataProto::erase_tensor(const std::string& key) { tensors_.erase(key); }

void DataProto::set_field(const std::string& key, std::vector<json> values) {
  check_rows("field", key, static_cast<int64_t>(values.size()), fields_.count(key) > 0);
  batch_size_ = static_cast<int64_t>(values.size());
  fields_[key] = std::move(values);
}

const std::vector<json>& DataProto::field(const std::string& key) const {
  auto it = fields_.find(key);
  HF_CHECK(it != fields_.end(), "DataProto: no field '", key, "'; available fields: ", key_list(fields_));
  return it->second;
}

bool DataProto::has_field(const std::string& key) const { return fields_.count(key) > 0; }

void DataProto::erase_field(const std::string& key) { fields_.erase(key); }

std::vector<DataProto> DataProto::chunk(int64_t n) const {
  HF_CHECK(n > 0, "DataProto::chunk: number of chunks must be positive, got ", n);
  int64_t b = batch_size();
  HF_CHECK(b % n == 0, "DataProto::chunk: batch size ", b, " is not divisible by ", n,
           " chunks; pad first with padded_to_multiple(", n, ", &pad) (", (n - b % n) % n,
           " rows) and drop the padding from the gathered result");
  std::vector<DataProto> out;
  out.reserve(static_cast<size_t>(n));
  int64_t rows = b / n;
  for (int64_t i = 0; i < n; ++i) out.push_back(slice(i * rows, (i + 1) * rows));
  return out;
}

DataProto DataProto::padded_to_multiple(int64_t n, int64_t* pad_count) const {
  HF_CHECK(n > 0, "DataProto::padded_to_multiple: multiple must be positive, got ", n);
  int64_t b = batch_size();
  int64_t pad = (n - b % n) % n;
  if (pad_count) *pad_count = pad;
  if (pad == 0) return *this;
  HF_CHECK(b > 0, "DataProto::padded_to_multiple: cannot pad an empty batch (no rows to repeat)");
  std::vector<int64_t> rows(static_cast<size_t>(b + pad));
  for (int64_t i = 0; i < b + pad; ++i) rows[static_cast<size_t>(i)] = i < b ? i : (i - b) % b;
  return index_select(torch::tensor(rows, torch::kLong));
}

DataProto DataProto::slice(int64_t begin, int64_t end) const {
  int64_t b = batch_size();
  HF_CHECK(0 <= begin && begin <= end && end <= b, "DataProto::slice: range [", begin, ", ", end,
           ") is outside the batch of ", b, " rows");
  DataProto out;
  out.meta_ = meta_;
  for (const auto& [key, t] : tensors_) out.set_tensor(key, t.narrow(0, begin, end - begin));
  for (const auto& [key, values] : fields_)
    out.set_field(key, std::vector<json>(values.begin() + begin, values.begin() + end));
  out.batch_size_ = end - begin;
  return out;
}

DataProto DataProto::index_select(const torch::Tensor& indices) const {
  HF_CHECK(indices.dim() == 1, "DataProto::index_select: indices must be 1-D, got shape ", shape_string(indices));
  HF_CHECK(indices.scalar_type() == torch::kLong || indices.scalar_type() == torch::kInt,
           "DataProto::index_select: indices must be int64 or int32, got ", c10::toString(indices.scalar_type()));
  torch::Tensor idx = indices.to(torch::kCPU, torch::kLong).contiguous();
  int64_t b = batch_size();
  std::vector<int64_t> rows(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + idx.numel());
  for (int64_t r : rows)
    HF_CHECK(0 <= r && r < b, "DataProto::index_select: row index ", r, " is outside the batch of ", b, " rows");
  DataProto out;
  out.meta_ = meta_;
  for (const auto& [key, t] : tensors_) out.set_tensor(key, gather_rows(t, idx));
  for (const auto& [key, values] : fields_) out.set_field(key, gather_rows(values, rows));
  out.batch_size_ = static_cast<int64_t>(rows.size());
  return out;
}

DataProto DataProto::select(const std::vector<std::string>& tensor_keys,
                            const std::vector<std::string>& field_keys) const {
  DataProto out;
  out.meta_ = meta_;
  for (const auto& key : tensor_keys) out.set_tensor(key, tensor(key));
  for (const auto& key : field_keys) out.set_field(key, field(key));
  return out;
}

DataProto DataProto::repeat(int64_t times, bool interleave) const {
  HF_CHECK(times > 0, "DataProto::repeat: times must be positive, got ", times);
  int64_t b = batch_size();
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(b * times));
  if (interleave) {
    for (int64_t r = 0; r < b; ++r)
      for (int64_t k = 0; k < times; ++k) rows.push_back(r);
  } else {
    for (int64_t k = 0; k < times; ++k)
      for (int64_t r = 0; r < b; ++r) rows.push_back(r);
  }
  return index_select(torch::tensor(rows, torch::kLong));
}

DataProto DataProto::concat(const std::vector<DataProto>& parts) {
  // Entirely empty parts (no keys) contribute nothing; every other part must have the same keys.
  std::vector<const DataProto*> used;
  for (const auto& p : parts)
    if (!p.empty()) used.push_back(&p);
  DataProto out;
  if (used.empty()) {
    if (!parts.empty()) out.meta_ = parts.front().meta_;
    return out;
  }
  const DataProto& first = *used.front();
  out.meta_ = first.meta_;
  for (size_t i = 1; i < used.size(); ++i) {
    const DataProto& p = *used[i];
    bool same = p.tensors_.size() == first.tensors_.size() && p.fields_.size() == first.fields_.size();
    for (const auto& kv : first.tensors_) same = same && p.tensors_.count(kv.first);
    for (const auto& kv : first.fields_) same = same && p.fields_.count(kv.first);
    HF_CHECK(same, "DataProto::concat: part ", i, " has tensors [", key_list(p.tensors_), "] fields [",
             key_list(p.fields_), "] but the first has tensors [", key_list(first.tensors_), "] fields [",
             key_list(first.fields_), "]");
  }
  for (const auto& [key, t0] : first.tensors_) {
    std::vector<torch::Tensor> pieces;
    for (const DataProto* p : used) {
      const torch::Tensor& t = p->tensors_.at(key);
      HF_CHECK(t.scalar_type() == t0.scalar_type() && t.sizes().slice(1) == t0.sizes().slice(1),
               "DataProto::concat: tensor '", key, "' is ", c10::toString(t.scalar_type()), " ", shape_string(t),
               " in one part but ", c10::toString(t0.scalar_type()), " ", shape_string(t0),
               " in the first (only dim 0 may differ)");
      pieces.push_back(t);
    }
    out.set_tensor(key, torch::cat(pieces, 0));
  }
  for (const auto& kv : first.fields_) {
    std::vector<json> values;
    for (const DataProto* p : used) {
      const auto& v = p->fields_.at(kv.first);
      values.insert(values.end(), v.begin(), v.end());
    }
    out.set_field(kv.first, std::move(values));
  }
  return out;
}

DataProto& DataProto::update(const DataProto& other) {
  if (!empty() && !other.empty())
    HF_CHECK(batch_size() == other.batch_size(), "DataProto::update: batch sizes differ: ", batch_size(), " vs ",
             other.batch_size());
  for (const auto& [key, t] : other.tensors_) {
    auto mine = tensors_.find(key);
    if (mine != tensors_.end()) {
      const torch::Tensor& a = mine->second;
      bool same = a.is_same(t) || (a.scalar_type() == t.scalar_type() && a.sizes() == t.sizes() &&
                                   torch::equal(a, t.to(a.device())));
      HF_CHECK(same, "DataProto::update: tensor '", key, "' is in both with different content (",
               c10::toString(a.scalar_type()), " ", shape_string(a), " vs ", c10::toString(t.scalar_type()), " ",
               shape_string(t), ")");
    }
  }
  for (const auto& [key, values] : other.fields_) {
    auto mine = fields_.find(key);
    if (mine != fields_.end())
      HF_CHECK(mine->second == values, "DataProto::update: field '", key, "' is in both with different content");
  }
  json merged_meta = meta_;
  merge_meta(merged_meta, other.meta_);
  // All checks passed: now mutate, so a failed update leaves this DataProto unchanged.
  for (const auto& [key, t] : other.tensors_)
    if (!tensors_.count(key)) set_tensor(key, t);
  for (const auto& [key, values] : other.fields_)
    if (!fields_.count(key)) set_field(key, values);
  meta_ = std::move(merged_meta);
  return *this;
}

DataProto DataProto::union_of(const DataProto& a, const DataProto& b) {
  DataProto out = a;
  out.update(b);
  return out;
}

DataProto DataProto::to(const torch::Device& device) const {
  DataProto out = *this;
  for (auto& kv : out.tensors_) kv.second = kv.second.to(device);
  return out;
}

std::string DataProto::summary() const {
  std::ostringstream out;
  out << "DataProto(batch " << batch_size() << "; tensors:";
  if (tensors_.empty()) out << " (none)";
  bool first = true;
  for (const auto& [key, t] : tensors_) {
    out << (first ? " " : ", ") << key << " " << dtype_name(t.scalar_type()) << shape_string(t);
    if (!t.device().is_cpu()) out << "@" << t.device();
    first = false;
  }
  out << "; fields: " << key_list(fields_) << "; meta:";
  if (!meta_.is_object() || meta_.empty()) out << " (none)";
  first = true;
  if (meta_.is_object())
    for (auto it = meta_.begin(); it != meta_.end(); ++it, first = false) out << (first ? " " : ", ") << it.key();
  out << ")";
  return out.str();
}

// ---- serialization ----

DataProto::Frames DataProto::to_frames() const {
  Frames frames;
  json header;
  header["batch_size"] = batch_size();
  json tensors = json::array();
  for (const auto& [key, t] : tensors_) {
    torch::Tensor payload = t.detach().to(torch::kCPU).contiguous();
    tensors.push_back({{"key", key},
                       {"dtype", dtype_name(t.scalar_type())},
                       {"shape", t.sizes().vec()},
                       {"nbytes", payload.numel() * static_cast<int64_t>(payload.element_size())}});
    frames.payloads.push_back(std::move(payload));
  }
  header["tensors"] = std::move(tensors);
  json fields = json::object();
  for (const auto& [key, values] : fields_) fields[key] = values;
  header["fields"] = std::move(fields);
  header["meta"] = meta_;
  try {
    frames.header = header.dump();
  } catch (const json::exception& e) {
    HF_FAIL("DataProto: cannot serialize fields/meta as JSON (strings must be UTF-8): ", e.what());
  }
  return frames;
}

DataProto DataProto::from_frames(const std::string& header_text, const std::vector<Buffer>& payloads) {
  json header = json::parse(header_text, nullptr, /*allow_exceptions=*/false);
  HF_CHECK(header.is_object(), "DataProto::from_frames: header is not a JSON object (", header_text.size(),
           " bytes)");
  DataProto out;
  try {
    const json& jb = header.at("batch_size");
    HF_CHECK(jb.is_number_integer() && jb.get<int64_t>() >= 0, "DataProto::from_frames: bad batch_size ",
             jb.dump());
    int64_t batch = jb.get<int64_t>();
    const json& jt = header.at("tensors");
    HF_CHECK(jt.is_array(), "DataProto::from_frames: 'tensors' must be an array");
    HF_CHECK(jt.size() == payloads.size(), "DataProto::from_frames: header lists ", jt.size(),
             " tensors but ", payloads.size(), " payloads were given");
    for (size_t i = 0; i < jt.size(); ++i) {
      const json& entry = jt[i];
      std::string key = entry.at("key").get<std::string>();
      HF_CHECK(!out.tensors_.count(key), "DataProto::from_frames: duplicate tensor key '", key, "'");
      c10::ScalarType dtype = dtype_from_name(entry.at("dtype").get<std::string>());
      const json& jshape = entry.at("shape");
      HF_CHECK(jshape.is_array() && !jshape.empty(), "DataProto::from_frames: tensor '", key,
               "' needs a non-empty shape");
      std::vector<int64_t> shape;
      uint64_t nbytes = c10::elementSize(dtype);
      for (const json& d : jshape) {
        HF_CHECK(d.is_number_integer() && d.get<int64_t>() >= 0, "DataProto::from_frames: tensor '", key,
                 "' has a bad dimension ", d.dump());
        shape.push_back(d.get<int64_t>());
        HF_CHECK(!__builtin_mul_overflow(nbytes, static_cast<uint64_t>(shape.back()), &nbytes),
                 "DataProto::from_frames: tensor '", key, "' shape overflows");
      }
      HF_CHECK(shape[0] == batch, "DataProto::from_frames: tensor '", key, "' has ", shape[0],
               " rows, batch_size is ", batch);
      const Buffer& buf = payloads[i];
      HF_CHECK(buf.size == nbytes, "DataProto::from_frames: tensor '", key, "' needs ", nbytes,
               " bytes but its payload has ", buf.size);
      HF_CHECK(buf.data != nullptr || nbytes == 0, "DataProto::from_frames: tensor '", key,
               "' has a null payload");
      auto options = torch::TensorOptions().dtype(dtype);
      torch::Tensor t;
      bool aligned = reinterpret_cast<uintptr_t>(buf.data) % c10::elementSize(dtype) == 0;
      if (nbytes == 0) {
        t = torch::empty(shape, options);
      } else if (aligned) {
        std::shared_ptr<void> owner = buf.owner;
        t = torch::from_blob(const_cast<void*>(buf.data), shape, [owner](void*) mutable { owner.reset(); },
                             options);
      } else {
        t = torch::empty(shape, options);
        std::memcpy(t.data_ptr(), buf.data, nbytes);
      }
      out.tensors_[key] = std::move(t);
    }
    const json& jf = header.at("fields");
    HF_CHECK(jf.is_object(), "DataProto::from_frames: 'fields' must be an object");
    for (auto it = jf.begin(); it != jf.end(); ++it) {
      HF_CHECK(it.value().is_array() && it.value().size() == static_cast<size_t>(batch),
               "DataProto::from_frames: field '", it.key(), "' must be an array of ", batch, " values");
      out.fields_[it.key()] = it.value().get<std::vector<json>>();
    }
    out.meta_ = header.at("meta");
    HF_CHECK(out.meta_.is_object(), "DataProto::from_frames: 'meta' must be an object");
    out.batch_size_ = batch;
  } catch (const json::exception& e) {
    HF_FAIL("DataProto::from_frames: malformed header: ", e.what());
  }
  return out;
}

std::string DataProto::serialize() const {
  Frames frames = to_frames();
  size_t total = align_up(kPrefixBytes + frames.header.size());
  for (const auto& p : frames.payloads) total = align_up(total + p.nbytes());
  std::string out(total, '\0');
  char* base = out.data();
  uint64_t header_len = frames.header.size();
  std::memcpy(base, kMagic, 4);
  std::memcpy(base + 4, &kVersion, 4);
  std::memcpy(base + 8, &header_len, 8);
  std::memcpy(base + kPrefixBytes, frames.header.data(), header_len);
  size_t offset = align_up(kPrefixBytes + header_len);
  for (const auto& p : frames.payloads) {
    if (p.nbytes() > 0) std::memcpy(base + offset, p.data_ptr(), p.nbytes());
    offset = align_up(offset + p.nbytes());
  }
  return out;
}

DataProto DataProto::deserialize(const std::string& bytes) { return deserialize(std::string(bytes)); }

DataProto DataProto::deserialize(std::string&& bytes_in) {
  auto owner = std::make_shared<std::string>(std::move(bytes_in));
  const std::string& bytes = *owner;
  HF_CHECK(bytes.size() >= kPrefixBytes && std::memcmp(bytes.data(), kMagic, 4) == 0,
           "DataProto::deserialize: not a serialized DataProto (", bytes.size(), " bytes, bad magic or too short)");
  uint32_t version = 0;
  uint64_t header_len = 0;
  std::memcpy(&version, bytes.data() + 4, 4);
  std::memcpy(&header_len, bytes.data() + 8, 8);
  HF_CHECK(version == kVersion, "DataProto::deserialize: unsupported format version ", version, " (expected ",
           kVersion, ")");
  HF_CHECK(header_len <= bytes.size() - kPrefixBytes, "DataProto::deserialize: truncated: header of ", header_len,
           " bytes but only ", bytes.size() - kPrefixBytes, " follow");
  std::string header = bytes.substr(kPrefixBytes, header_len);
  json parsed = json::parse(header, nullptr, /*allow_exceptions=*/false);
  HF_CHECK(parsed.is_object() && parsed.contains("tensors") && parsed["tensors"].is_array(),
           "DataProto::deserialize: corrupt header (not a JSON object with a 'tensors' array)");
  std::vector<Buffer> payloads;
  size_t offset = align_up(kPrefixBytes + header_len);
  for (const json& entry : parsed["tensors"]) {
    HF_CHECK(entry.is_object() && entry.contains("nbytes") && entry["nbytes"].is_number_integer() &&
                 entry["nbytes"].get<int64_t>() >= 0,
             "DataProto::deserialize: corrupt header (tensor entry without a valid 'nbytes')");
    uint64_t nbytes = entry["nbytes"].get<uint64_t>();
    HF_CHECK(offset <= bytes.size() && nbytes <= bytes.size() - offset, "DataProto::deserialize: truncated: ",
             "payload needs ", nbytes, " bytes at offset ", offset, " but the input has ", bytes.size());
    payloads.push_back(Buffer{bytes.data() + offset, nbytes, owner});
    offset = align_up(offset + nbytes);
  }
  HF_CHECK(offset == bytes.size(), "DataProto::deserialize: expected ", offset, " bytes, got ", bytes.size());
  return from_frames(header, payloads);
}

}  // namespace hybridflow
