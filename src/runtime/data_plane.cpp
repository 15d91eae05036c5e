#include "data_plane.h"

#include <torch/torch.h>

#include <algorithm>
#include <array>
#include <future>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "hybridflow/core/error.h"
#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/select_rows.h"
#include "transport/message.h"

namespace hybridflow::runtime_detail {
namespace {

using json = nlohmann::json;
using Run = std::array<int64_t, 3>;  // start row in the producer's output, count, first row where it goes

int64_t source_of(size_t rank, int64_t row) { return (static_cast<int64_t>(rank) << 32) | row; }
int rank_of(int64_t source) { return static_cast<int>(source >> 32); }
int64_t row_of(int64_t source) { return source & 0xffffffffLL; }

// The first `n` rows' sources grouped by the rank that holds them, each rank's rows merged into runs of
// consecutive producer rows that land on consecutive destination rows: one copy (or one fetch) per run.
std::map<int, std::vector<Run>> runs_by_rank(const std::vector<int64_t>& sources, int64_t n) {
  std::map<int, std::vector<Run>> runs;
  for (int64_t i = 0; i < n; ++i) {
    auto& list = runs[rank_of(sources[static_cast<size_t>(i)])];
    const int64_t row = row_of(sources[static_cast<size_t>(i)]);
    if (!list.empty() && list.back()[0] + list.back()[1] == row && list.back()[2] + list.back()[1] == i)
      ++list.back()[1];
    else
      list.push_back({row, 1, i});
  }
  return runs;
}

std::vector<int64_t> shape_of(int64_t rows, const std::vector<int64_t>& tail, bool marker = false) {
  std::vector<int64_t> shape = {rows};
  if (marker) shape.push_back(0);
  shape.insert(shape.end(), tail.begin(), tail.end());
  return shape;
}

size_t row_bytes(const TensorSpec& spec) {
  size_t cells = 1;
  for (int64_t d : spec.tail) cells *= static_cast<size_t>(d);
  return cells * c10::elementSize(spec.dtype);
}

TensorSpec spec_of(const torch::Tensor& t) {
  return {t.scalar_type(), std::vector<int64_t>(t.sizes().begin() + 1, t.sizes().end())};
}

std::vector<int64_t> sources_of(const DataProto& part) {
  if (!part.has_tensor(kSourceKey)) return {};  // no rows: every source rank's output was empty
  const torch::Tensor s = part.tensor(kSourceKey).contiguous();
  return std::vector<int64_t>(s.data_ptr<int64_t>(), s.data_ptr<int64_t>() + s.numel());
}

// Only what a consumer or a reader of the result sees: no markers, no row sources.
void strip(DataProto& part) {
  std::vector<std::string> drop;
  for (const auto& kv : part.tensors())
    if (kv.first == kSourceKey || kv.first.rfind(kKeptPrefix, 0) == 0) drop.push_back(kv.first);
  for (const auto& key : drop) part.erase_tensor(key);
}

// ---- Where the controller's fetched tensors came from ----

struct Origin {
  std::shared_ptr<const HeldObject> object;
  std::string key;                                      // in the object
  std::shared_ptr<const std::vector<int64_t>> sources;  // per row; -1: the row came in an answer
  TensorSpec spec;
  int64_t version = 0;  // a tensor written into since is not the object's any more
};

struct Origins {
  std::mutex mutex;
  std::unordered_map<const void*, Origin> by_data;
};

// Never destroyed: the last fetched tensors may die during static destruction.
Origins& origins() {
  static auto* instance = new Origins;
  return *instance;
}

// `full` as a tensor whose storage, while it lives, is known to hold `origin`'s rows.
torch::Tensor remember(torch::Tensor full, Origin origin) {
  if (full.numel() == 0) return full;
  void* data = full.data_ptr();
  torch::Tensor wrapped = torch::from_blob(
      data, full.sizes(),
      [full, data](void*) {
        Origin gone;  // released after the lock: its handle may release the object
        std::lock_guard<std::mutex> lock(origins().mutex);
        auto it = origins().by_data.find(data);
        if (it != origins().by_data.end()) {
          gone = std::move(it->second);
          origins().by_data.erase(it);
        }
      },
      full.options());
  origin.version = wrapped._version();
  std::lock_guard<std::mutex> lock(origins().mutex);
  origins().by_data[data] = std::move(origin);
  return wrapped;
}

struct RowsOrigin {
  std::shared_ptr<const HeldObject> object;
  std::string key;
  TensorSpec spec;
  std::vector<int64_t> sources;
};

// The record of a tensor that is whole rows fetched from workers, untouched since, and the first of those rows.
std::optional<std::pair<Origin, int64_t>> locate(const torch::Tensor& t) {
  if (!t.defined() || !t.device().is_cpu() || !t.has_storage() || t.dim() == 0 || t.numel() == 0) return std::nullopt;
  std::lock_guard<std::mutex> lock(origins().mutex);
  auto it = origins().by_data.find(t.storage().data());
  if (it == origins().by_data.end()) return std::nullopt;
  const Origin& o = it->second;
  if (t.scalar_type() != o.spec.dtype || t.sizes().slice(1) != c10::IntArrayRef(o.spec.tail) || !t.is_contiguous() ||
      t._version() != o.version)
    return std::nullopt;
  const int64_t cells = t.numel() / t.size(0);
  if (t.storage_offset() % cells != 0) return std::nullopt;
  const int64_t first = t.storage_offset() / cells;
  if (first + t.size(0) > static_cast<int64_t>(o.sources->size())) return std::nullopt;
  return std::pair{o, first};
}

// Whole rows of a tensor fetched from workers, untouched since: where they live.
std::optional<RowsOrigin> find_origin(const torch::Tensor& t) {
  auto located = locate(t);
  if (!located) return std::nullopt;
  const auto& [o, first] = *located;
  RowsOrigin out{o.object, o.key, o.spec,
                 std::vector<int64_t>(o.sources->begin() + first, o.sources->begin() + first + t.size(0))};
  for (int64_t s : out.sources)
    if (s < 0) return std::nullopt;
  return out;
}

// ---- Plans ----

class PlanBuilder {
 public:
  PlanBuilder(int64_t rows, double timeout_s) : rows_(rows), timeout_s_(timeout_s) {}

  // Input tensor `key` is `object_key` of `object`, its rows at `sources` (one per input row).
  void add(const std::string& key, const std::shared_ptr<const HeldObject>& object, const std::string& object_key,
           const TensorSpec& spec, const std::vector<int64_t>& sources) {
    tensors_[key] = {{"dtype", dtype_name(spec.dtype)}, {"shape", spec.tail}};
    for (auto& [rank, list] : runs_by_rank(sources, rows_)) {
      auto it = std::find_if(pieces_.begin(), pieces_.end(), [&, r = rank](const Piece& p) {
        return p.object == object && p.rank == r && p.runs == list;
      });
      if (it == pieces_.end()) it = pieces_.insert(pieces_.end(), Piece{object, rank, std::move(list), json::object()});
      it->keys[key] = object_key;
    }
    if (std::find(holds.begin(), holds.end(), object) == holds.end()) holds.push_back(object);
  }

  bool empty() const { return tensors_.empty(); }

  json plan() const {
    json pieces = json::array();
    for (const auto& p : pieces_) {
      const auto& info = p.object->ranks.at(static_cast<size_t>(p.rank));
      json runs = json::array();
      for (const auto& r : p.runs) runs.push_back({r[0], r[1], r[2]});
      pieces.push_back({{"source",
                         {{"node", info.node}, {"endpoint", info.data_endpoint}, {"pool", p.object->pool_name},
                          {"role", p.object->role}, {"method", p.object->method}, {"rank", p.rank},
                          {"pid", info.pid}, {"host", info.host}}},
                        {"object", p.object->id},
                        {"keys", p.keys},
                        {"runs", runs}});
    }
    return {{"rows", rows_}, {"timeout_s", timeout_s_}, {"tensors", tensors_}, {"pieces", pieces}};
  }

  std::vector<std::shared_ptr<const HeldObject>> holds;

 private:
  struct Piece {
    std::shared_ptr<const HeldObject> object;
    int rank;
    std::vector<Run> runs;
    json keys;  // input key -> object key
  };
  int64_t rows_;
  double timeout_s_;
  json tensors_ = json::object();
  std::vector<Piece> pieces_;
};

// Workers of `consumer` may fetch the object's rows themselves.
bool consumer_can_fetch(const HeldObject& object, const ProcessPool& consumer) {
  if (!consumer.spec().data_plane) return false;
  auto producer = object.pool.lock();
  return producer && !producer->failed() && producer->shares_data_key(consumer);
}

// ---- Fetching to the controller ----

struct Fetch {
  std::future<DataProto> rows;
  std::vector<Run> runs;  // what the answer holds, in order
};

// Asks `rank` for rows `runs` of `keys`, in requests whose answers fit a message.
void start_fetches(ProcessPool& pool, const HeldObject& object, int rank, const std::vector<std::string>& keys,
                   size_t bytes_per_row, const std::vector<Run>& runs, std::vector<Fetch>* fetches) {
  const size_t limit = transport_detail::max_message_bytes() / 2;
  HF_CHECK(bytes_per_row <= limit, object.what(), ": one row is ", bytes_per_row,
           " bytes, more than half of HF_MAX_MESSAGE_BYTES");
  const int64_t max_rows = bytes_per_row == 0 ? std::numeric_limits<int64_t>::max()
                                              : static_cast<int64_t>(limit / bytes_per_row);
  std::vector<Run> batch;
  int64_t in_batch = 0;
  auto send = [&] {
    if (batch.empty()) return;
    auto promise = std::make_shared<std::promise<DataProto>>();
    std::vector<std::pair<int64_t, int64_t>> wanted;
    for (const auto& r : batch) wanted.emplace_back(r[0], r[1]);
    fetches->push_back({promise->get_future(), std::move(batch)});
    pool.fetch(
        rank, object.id, keys, wanted, object.role, object.method,
        [promise](DataProto&& rows) { promise->set_value(std::move(rows)); },
        [promise](std::exception_ptr e) { promise->set_exception(e); });
    batch.clear();
    in_batch = 0;
  };
  for (Run run : runs) {
    while (run[1] > 0) {
      const int64_t take = std::min(run[1], max_rows - in_batch);
      batch.push_back({run[0], take, run[2]});
      in_batch += take;
      run[0] += take;
      run[1] -= take;
      run[2] += take;
      if (in_batch == max_rows) send();
    }
  }
  send();
}

// Copies each fetch's rows where they go; waits for every fetch first (their callbacks own nothing here).
void finish_fetches(std::vector<Fetch>& fetches, const HeldObject& object, std::map<std::string, torch::Tensor>& into) {
  for (auto& f : fetches) f.rows.wait();
  for (auto& f : fetches) {
    DataProto rows = f.rows.get();
    for (auto& [key, dest] : into) {
      HF_CHECK(rows.has_tensor(key), object.what(), ": a worker answered without tensor '", key, "'");
      const torch::Tensor& t = rows.tensor(key);
      int64_t offset = 0;
      for (const auto& r : f.runs) {
        HF_CHECK(t.scalar_type() == dest.scalar_type() && t.dim() == dest.dim() && offset + r[1] <= t.size(0) &&
                     t.sizes().slice(1) == dest.sizes().slice(1),
                 object.what(), ": a worker answered tensor '", key, "' as ", c10::toString(t.scalar_type()), " ",
                 t.sizes(), ", not the rows asked for");
        dest.narrow(0, r[2], r[1]).copy_(t.narrow(0, offset, r[1]));
        offset += r[1];
      }
    }
  }
}

std::shared_ptr<ProcessPool> producer_of(const HeldObject& object) {
  auto pool = object.pool.lock();
  HF_CHECK(pool, object.what(), " is kept by the workers of pool '", object.pool_name, "', which is gone (shut down)");
  return pool;
}

}  // namespace

HeldObject::~HeldObject() {
  if (id < 0) return;
  if (auto p = pool.lock()) p->release(id);
}

std::string HeldObject::what() const { return "the output of " + role + "." + method + " on pool '" + pool_name + "'"; }

std::shared_ptr<const CallResult> call_result(const std::shared_ptr<ProcessPool>& pool, const std::string& role,
                                              const std::string& method, const std::string& protocol,
                                              const std::vector<MeshCoord>& coords,
                                              std::vector<ProcessPool::RankOutput>&& outputs) {
  const bool any_kept = std::any_of(outputs.begin(), outputs.end(), [](const auto& o) { return !o.kept.is_null(); });
  if (!any_kept) {
    std::vector<DataProto> per_rank;
    for (auto& o : outputs) per_rank.push_back(std::move(o.data));
    DataProto merged = collect_outputs(protocol, per_rank, coords);  // a throw goes to the call's error path
    return std::make_shared<CallResult>(std::move(merged), std::move(per_rank));
  }
  auto object = std::make_shared<HeldObject>();
  object->pool = pool;
  object->pool_name = pool->spec().name;
  object->role = role;
  object->method = method;
  for (int r = 0; r < pool->size(); ++r) object->ranks.push_back(pool->rank_info(r));
  auto result = std::make_shared<RemoteResult>();
  const size_t n = outputs.size();
  result->kept_by.assign(n, false);
  result->rows.assign(n, 0);
  for (size_t r = 0; r < n; ++r) {
    const json& kept = outputs[r].kept;
    result->rows[r] = outputs[r].data.batch_size();
    if (kept.is_null()) continue;
    object->id = kept.at("object").get<int64_t>();  // the call's id, the same on every rank
    result->kept_by[r] = true;
    for (const auto& d : kept.at("tensors")) {
      const auto shape = d.at("shape").get<std::vector<int64_t>>();
      result->rows[r] = shape.at(0);
      result->kept.emplace(d.at("key").get<std::string>(),
                           TensorSpec{dtype_from_name(d.at("dtype")), std::vector<int64_t>(shape.begin() + 1, shape.end())});
    }
  }
  result->object = object;
  // Skeletons: each answer with markers for the kept tensors and the row sources, so that collect()
  // merges, orders and checks them as it would the whole outputs.
  std::vector<DataProto> skeletons;
  for (size_t r = 0; r < n; ++r) {
    DataProto skeleton = outputs[r].data;
    if (result->kept_by[r]) {
      for (const auto& d : outputs[r].kept.at("tensors")) {
        const auto shape = d.at("shape").get<std::vector<int64_t>>();
        skeleton.set_tensor(kKeptPrefix + d.at("key").get<std::string>(),
                            torch::empty(shape_of(shape.at(0), {shape.begin() + 1, shape.end()}, true),
                                         torch::TensorOptions().dtype(dtype_from_name(d.at("dtype")))));
      }
    } else {
      // A rank that kept nothing (its table was full) sent its kept keys' rows: they stay in its answer.
      for (const auto& [key, spec] : result->kept) {
        if (!skeleton.has_tensor(key)) continue;
        const torch::Tensor t = skeleton.tensor(key);
        const TensorSpec own = spec_of(t);
        skeleton.erase_tensor(key);
        skeleton.set_tensor(kKeptPrefix + key, torch::empty(shape_of(t.size(0), own.tail, true),
                                                            torch::TensorOptions().dtype(own.dtype)));
        if (t.size(0) > 0) result->through_controller = true;
      }
    }
    if (!skeleton.empty()) {
      std::vector<int64_t> sources(static_cast<size_t>(result->rows[r]));
      for (int64_t i = 0; i < result->rows[r]; ++i) sources[static_cast<size_t>(i)] = source_of(r, i);
      skeleton.set_tensor(kSourceKey, torch::tensor(sources, torch::kLong));
    }
    skeletons.push_back(std::move(skeleton));
    result->answers.push_back(std::move(outputs[r].data));
  }
  result->skeleton = collect_outputs(protocol, skeletons, coords);
  return std::make_shared<CallResult>(std::shared_ptr<const RemoteResult>(std::move(result)));
}

RoutedInputs route_inputs(const DataProto* value, const std::shared_ptr<const CallResult>& from,
                          const std::string& protocol, const std::vector<MeshCoord>& coords,
                          const ProcessPool& consumer) {
  const bool rows_only = ProtocolRegistry::instance().get(protocol).moves_rows;
  const RemoteResult* remote = from ? from->remote().get() : nullptr;
  const double timeout_s = consumer.spec().data_fetch_timeout_s;
  RoutedInputs out;
  auto add = [&](DataProto part, PlanBuilder& plan) {
    for (const auto& h : plan.holds)
      if (std::find(out.holds.begin(), out.holds.end(), h) == out.holds.end()) out.holds.push_back(h);
    out.inputs.push_back({std::move(part), plan.empty() ? json() : plan.plan()});
  };
  if (remote && !remote->through_controller && rows_only && consumer_can_fetch(*remote->object, consumer)) {
    // The skeleton goes through the consumer's dispatch; each rank's row sources become its plan.
    for (DataProto& part : dispatch_input(protocol, remote->skeleton, coords)) {
      const std::vector<int64_t> sources = sources_of(part);
      const int64_t rows = static_cast<int64_t>(sources.size());
      strip(part);
      PlanBuilder plan(rows, timeout_s);
      for (const auto& [key, spec] : remote->kept) {
        if (rows > 0)
          plan.add(key, remote->object, key, spec, sources);
        else  // no rows to fetch: the keys still arrive, empty, as they would have
          part.set_tensor(key, torch::empty(shape_of(0, spec.tail), torch::TensorOptions().dtype(spec.dtype)));
      }
      add(std::move(part), plan);
    }
    return out;
  }
  const DataProto& input = from ? from->merged() : *value;
  for (DataProto& part : dispatch_input(protocol, input, coords)) {
    PlanBuilder plan(part.batch_size(), timeout_s);
    std::vector<std::string> planned;
    for (const auto& [key, t] : part.tensors()) {
      auto origin = find_origin(t);
      if (!origin || !consumer_can_fetch(*origin->object, consumer)) continue;
      plan.add(key, origin->object, origin->key, origin->spec, origin->sources);
      planned.push_back(key);
    }
    for (const auto& key : planned) part.erase_tensor(key);
    add(std::move(part), plan);
  }
  return out;
}

DataProto visible_skeleton(const RemoteResult& result) {
  DataProto out = result.skeleton;
  strip(out);
  return out;
}

std::string tensor_names(const RemoteResult& result) {
  std::vector<std::string> names;
  const DataProto visible = visible_skeleton(result);
  for (const auto& kv : visible.tensors()) names.push_back(kv.first);
  for (const auto& kv : result.kept) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "" : ", ") + n;
  return out.empty() ? "(none)" : out;
}

std::map<std::string, torch::Tensor> materialize(const RemoteResult& result, const std::vector<std::string>& keys) {
  std::map<std::string, torch::Tensor> out;
  if (keys.empty()) return out;
  const std::vector<int64_t> sources = sources_of(result.skeleton);
  const int64_t n = static_cast<int64_t>(sources.size());
  size_t bytes_per_row = 0;
  for (const auto& key : keys) {
    const TensorSpec& spec = result.kept.at(key);
    out[key] = torch::empty(shape_of(n, spec.tail), torch::TensorOptions().dtype(spec.dtype));
    bytes_per_row += row_bytes(spec);
  }
  // Runs of merged rows by the rank holding them; rows of ranks that kept nothing are in their answers.
  const std::map<int, std::vector<Run>> runs = runs_by_rank(sources, n);
  std::vector<Fetch> fetches;
  std::shared_ptr<ProcessPool> pool;
  for (const auto& [rank, list] : runs) {
    if (result.kept_by.at(static_cast<size_t>(rank))) {
      if (!pool) pool = producer_of(*result.object);
      start_fetches(*pool, *result.object, rank, keys, bytes_per_row, list, &fetches);
      continue;
    }
    for (auto& [key, dest] : out)
      for (const auto& r : list)
        dest.narrow(0, r[2], r[1]).copy_(result.answers.at(static_cast<size_t>(rank)).tensor(key).narrow(0, r[0], r[1]));
  }
  finish_fetches(fetches, *result.object, out);
  auto rows_at = std::make_shared<std::vector<int64_t>>(sources);
  for (auto& s : *rows_at)
    if (!result.kept_by.at(static_cast<size_t>(rank_of(s)))) s = -1;
  for (auto& [key, t] : out) t = remember(t, Origin{result.object, key, rows_at, result.kept.at(key), 0});
  return out;
}

std::vector<DataProto> materialize_per_rank(const RemoteResult& result) {
  std::vector<DataProto> out = result.answers;
  std::vector<std::string> keys;
  size_t bytes_per_row = 0;
  for (const auto& [key, spec] : result.kept) {
    keys.push_back(key);
    bytes_per_row += row_bytes(spec);
  }
  for (size_t r = 0; r < out.size(); ++r) {
    if (!result.kept_by[r]) continue;
    std::map<std::string, torch::Tensor> tensors;
    for (const auto& [key, spec] : result.kept)
      tensors[key] = torch::empty(shape_of(result.rows[r], spec.tail), torch::TensorOptions().dtype(spec.dtype));
    std::vector<Fetch> fetches;
    if (result.rows[r] > 0)
      start_fetches(*producer_of(*result.object), *result.object, static_cast<int>(r), keys, bytes_per_row,
                    std::vector<Run>{Run{0, result.rows[r], 0}}, &fetches);
    finish_fetches(fetches, *result.object, tensors);
    for (auto& [key, t] : tensors) out[r].set_tensor(key, std::move(t));
  }
  return out;
}

}  // namespace hybridflow::runtime_detail

namespace hybridflow {

DataProto select_rows(const DataProto& batch, const std::vector<int64_t>& rows) {
  using namespace runtime_detail;
  DataProto out = batch.index_select(torch::tensor(rows, torch::kLong));
  for (const auto& [key, t] : batch.tensors()) {
    auto located = locate(t);
    if (!located) continue;
    const auto& [o, first] = *located;
    auto sources = std::make_shared<std::vector<int64_t>>();
    sources->reserve(rows.size());
    for (int64_t r : rows) sources->push_back((*o.sources)[static_cast<size_t>(first + r)]);
    out.set_tensor(key, remember(out.tensor(key), Origin{o.object, o.key, std::move(sources), o.spec, 0}));
  }
  return out;
}

}  // namespace hybridflow
