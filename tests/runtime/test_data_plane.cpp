// The data plane over real worker processes: outputs kept by the workers that made them, rows fetched by
// the consumer's ranks straight from the producer's (across pools, re-split over another rank count, from
// the same process without a copy), the controller fetching only what it reads, objects released with
// their last handle, and the failures: a dead or frozen producer is an error naming it, never a hang; a
// stranger's fetch is dropped.
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

#include "hybridflow/runtime/protocol.h"
#include "hybridflow/runtime/select_rows.h"
#include "hybridflow/runtime/worker.h"

using namespace hybridflow;

namespace {

// Row i of "make" for input value x: seq = x * 100 + [0..8), wide = x + [0..16) / 16, small = x.
torch::Tensor seq_of(const torch::Tensor& x) {
  return x.to(torch::kLong).unsqueeze(1) * 100 + torch::arange(8, torch::kLong).unsqueeze(0);
}

class MakerWorker : public hybridflow::Worker {
 public:
  void register_methods(MethodTable& table) override {
    table.add("make", protocols::kDataParallel, [](const DataProto& in) {
      DataProto out;
      const torch::Tensor x = in.tensor("x");
      const torch::Tensor seq = seq_of(x);
      out.set_tensor("seq", seq);
      out.set_tensor("wide", x.unsqueeze(1) + torch::arange(16, torch::kFloat).unsqueeze(0) / 16);
      out.set_tensor("small", x.clone());  // 4 bytes a row: travels with the answer
      out.set_tensor("made_at", torch::full({x.size(0)}, reinterpret_cast<int64_t>(seq.data_ptr()), torch::kLong));
      if (in.has_field("tag")) out.set_field("tag", in.field("tag"));
      return out;
    });
    // Rank r answers 1 + 3r rows (ONE_TO_ALL concatenates them): ranks keep different amounts.
    table.add("uneven", protocols::kOneToAll, [this](const DataProto&) {
      DataProto out;
      const int64_t rows = 1 + 3 * rank();
      out.set_tensor("seq", seq_of(torch::full({rows}, static_cast<float>(rank()))));
      return out;
    });
  }
};

// Whether `address` lies in a mapping of a shared-rows file (/proc/self/maps names it "/memfd:hf-rows").
bool in_shared_file(const void* address) {
  std::ifstream maps("/proc/self/maps");
  const auto at = reinterpret_cast<uintptr_t>(address);
  for (std::string line; std::getline(maps, line);) {
    if (line.find("/memfd:hf-rows") == std::string::npos) continue;
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) == 2 && at >= lo && at < hi) return true;
  }
  return false;
}

// Descriptors of process `pid` that are shared-rows files.
int open_row_files(int pid) {
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code link_ec;
    if (std::filesystem::read_symlink(e.path(), link_ec).string().find("memfd:hf-rows") != std::string::npos) ++n;
  }
  return n;
}

class ReaderWorker : public hybridflow::Worker {
 public:
  void register_methods(MethodTable& table) override {
    // What it was given, summarised per row, and where the rows lie in this process.
    table.add("read", protocols::kDataParallel, [this](const DataProto& in) {
      DataProto out;
      const torch::Tensor seq = in.tensor("seq");
      out.set_tensor("seq_sum", seq.sum(1));
      out.set_tensor("read_at", torch::full({seq.size(0)}, reinterpret_cast<int64_t>(seq.data_ptr()), torch::kLong));
      out.set_tensor("reader", torch::full({seq.size(0)}, static_cast<int64_t>(rank()), torch::kLong));
      out.set_tensor("keys", torch::full({seq.size(0)}, static_cast<int64_t>(in.tensors().size()), torch::kLong));
      if (in.has_tensor("wide")) out.set_tensor("wide_sum", in.tensor("wide").sum(1));
      if (in.has_field("tag")) out.set_field("tag", in.field("tag"));
      return out;
    });
    // Its inputs back, and whether each lies in a file a producer on this machine shared (shared_rows.h).
    table.add("echo", protocols::kDataParallel, [](const DataProto& in) {
      DataProto out;
      out.set_tensor("seq", in.tensor("seq").clone());
      out.set_tensor("wide", in.tensor("wide").clone());
      const bool mapped = in_shared_file(in.tensor("seq").data_ptr()) && in_shared_file(in.tensor("wide").data_ptr());
      out.set_tensor("mapped", torch::full({in.batch_size()}, static_cast<int64_t>(mapped), torch::kLong));
      return out;
    });
    table.add("scribble", protocols::kDataParallel, [](const DataProto& in) {
      in.tensor("seq").add_(1);  // against the rules: shared inputs are read-only
      return DataProto();
    });
  }
};

}  // namespace

HF_REGISTER_WORKER(MakerWorker, "maker");
HF_REGISTER_WORKER(ReaderWorker, "reader");

#include "transport/message.h"
#include "runtime/runtime_test_workers.h"

namespace {

DataProto tagged_batch(int64_t n) {
  DataProto d = batch(n);
  std::vector<nlohmann::json> tags;
  for (int64_t i = 0; i < n; ++i) tags.push_back("row" + std::to_string(i));
  d.set_field("tag", tags);
  return d;
}

// Waits (up to 10 s) until the workers' heartbeats report `objects` kept outputs.
bool held_becomes(const ProcessPool& pool, int64_t objects) {
  auto t0 = std::chrono::steady_clock::now();
  while (seconds_since(t0) < 10) {
    if (pool.held_objects().objects == objects) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Pool "prod" (2 processes: the maker, and a reader colocated with it) and pool "cons" (3 readers).
class DataPlaneJob : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ctl_ = new Controller();
    ctl_->add_pools({pool_spec("prod", 2), pool_spec("cons", 3)});
    maker_ = new WorkerGroup(ctl_->create_group("prod", "maker", "maker"));
    local_reader_ = new WorkerGroup(ctl_->create_group("prod", "local_reader", "reader"));
    reader_ = new WorkerGroup(ctl_->create_group("cons", "reader", "reader"));
  }
  static void TearDownTestSuite() {
    for (auto* g : {maker_, local_reader_, reader_}) delete g;
    delete ctl_;
  }
  static Controller* ctl_;
  static WorkerGroup *maker_, *local_reader_, *reader_;
};
Controller* DataPlaneJob::ctl_ = nullptr;
WorkerGroup *DataPlaneJob::maker_, *DataPlaneJob::local_reader_, *DataPlaneJob::reader_;

constexpr int64_t kSeqBytes = 6 * 8 * 8;  // the seq tensor of a 6-row batch

TEST_F(DataPlaneJob, ConsumerRanksFetchTheirRowsFromAnotherPoolReSplit) {
  ctl_->take_traffic();
  Future made = maker_->call("make", tagged_batch(6));
  Future read = reader_->call("read", made);  // 2 producer ranks x 3 rows -> 3 consumer ranks x 2 rows
  const DataProto& got = read.get();
  EXPECT_TRUE(made.held_on_workers());
  const Traffic traffic = ctl_->take_traffic();
  // The readers saw the right rows, and every tensor of the output (small ones came through the controller).
  EXPECT_EQ(longs(got.tensor("seq_sum")), longs(seq_of(torch::arange(6, torch::kFloat)).sum(1)));
  EXPECT_EQ(longs(got.tensor("reader")), (std::vector<int64_t>{0, 0, 1, 1, 2, 2}));
  EXPECT_EQ(longs(got.tensor("keys")), std::vector<int64_t>(6, 4));  // seq, wide, small, made_at
  EXPECT_EQ(got.field("tag")[3], "row3");
  EXPECT_TRUE(torch::allclose(got.tensor("wide_sum"), torch::arange(6, torch::kFloat) * 16 + 7.5));
  // The bulk (seq, wide) went worker to worker; the controller sent x and the small tensors (to the
  // readers), and received the small tensors and the readers' outputs.
  uint64_t read_bytes = 0;
  for (const auto& kv : got.tensors()) read_bytes += kv.second.numel() * kv.second.element_size();
  EXPECT_EQ(traffic.controller_sent_bytes, 6u * 4 + 6u * 4 + 6u * 8);          // x; small, made_at
  EXPECT_EQ(traffic.controller_received_bytes, 6u * 4 + 6u * 8 + read_bytes);  // small, made_at, the readers'
  EXPECT_EQ(traffic.worker_to_worker_bytes, 6u * (8 * 8 + 16 * 4));            // seq and wide
}

TEST_F(DataPlaneJob, TheControllerFetchesOnlyWhatItReads) {
  Future made = maker_->call("make", batch(6));
  made.wait();
  ctl_->take_traffic();
  const DataProto only_seq = made.get({"seq"});
  EXPECT_EQ(ctl_->take_traffic().controller_received_bytes, static_cast<uint64_t>(kSeqBytes));
  EXPECT_EQ(only_seq.tensors().size(), 1u);
  EXPECT_TRUE(torch::equal(only_seq.tensor("seq"), seq_of(torch::arange(6, torch::kFloat))));
  // The whole result: the same bytes as without the data plane (checked below), wide fetched now.
  const DataProto& all = made.get();
  EXPECT_EQ(ctl_->take_traffic().controller_received_bytes, static_cast<uint64_t>(6 * 16 * 4));
  EXPECT_TRUE(torch::equal(all.tensor("seq"), only_seq.tensor("seq")));
  EXPECT_TRUE(torch::equal(all.tensor("small"), torch::arange(6, torch::kFloat)));
  ASSERT_EQ(made.per_rank().size(), 2u);
  EXPECT_TRUE(torch::equal(made.per_rank()[1].tensor("seq"), seq_of(torch::arange(3, 6).to(torch::kFloat))));
  try {
    made.get({"nope"});
    ADD_FAILURE() << "an unknown key must fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("seq, small, wide"), std::string::npos) << e.what();
  }
}

TEST_F(DataPlaneJob, AColocatedConsumerReadsTheKeptTensorWithoutACopy) {
  ctl_->take_traffic();
  Future made = maker_->call("make", batch(4));
  const DataProto read = local_reader_->call("read", made).get();
  EXPECT_EQ(ctl_->take_traffic().worker_to_worker_bytes, 0u);
  // Same rows on the same rank: the reader's input is the maker's output tensor itself.
  EXPECT_EQ(longs(read.tensor("read_at")), longs(made.get({"made_at"}).tensor("made_at")));
  EXPECT_EQ(longs(read.tensor("seq_sum")), longs(seq_of(torch::arange(4, torch::kFloat)).sum(1)));
  // Which is why writing into it is refused: the next reader would see other bytes.
  const std::string message = message_of(local_reader_->call("scribble", made));
  EXPECT_NE(message.find("modified in place"), std::string::npos) << message;
}

TEST_F(DataPlaneJob, TensorsFetchedByTheControllerAreFetchedByConsumersToo) {
  Future made = maker_->call("make", batch(6));
  const DataProto fetched = made.get();
  ctl_->take_traffic();
  // A batch the controller built from fetched tensors: their rows still come from the makers.
  const DataProto read = reader_->call("read", fetched.select({"seq"})).get();
  EXPECT_EQ(ctl_->take_traffic().controller_sent_bytes, 0u);
  EXPECT_EQ(longs(read.tensor("seq_sum")), longs(seq_of(torch::arange(6, torch::kFloat)).sum(1)));
  // Once the controller writes into a tensor, it is its own: sent whole.
  DataProto changed = fetched.select({"seq"});
  changed.tensor("seq").mul_(2);
  const DataProto read_changed = reader_->call("read", changed).get();
  EXPECT_GE(ctl_->take_traffic().controller_sent_bytes, static_cast<uint64_t>(kSeqBytes));
  EXPECT_EQ(longs(read_changed.tensor("seq_sum")), longs(seq_of(torch::arange(6, torch::kFloat)).sum(1) * 2));
}

// select_rows (a balanced or any other row order) keeps what index_select forgets: where the rows live.
TEST_F(DataPlaneJob, RowsPickedInAnyOrderAreStillFetchedByTheConsumers) {
  Future made = maker_->call("make", batch(6));
  const DataProto fetched = made.get();
  const std::vector<int64_t> order = {5, 0, 3, 1, 4, 2};
  const std::vector<int64_t> expected = {5, 0, 3, 1, 4, 2};
  ctl_->take_traffic();
  const DataProto read = reader_->call("read", select_rows(fetched.select({"seq"}), order)).get();
  EXPECT_EQ(ctl_->take_traffic().controller_sent_bytes, 0u);
  EXPECT_EQ(longs(read.tensor("seq_sum")),
            longs(seq_of(torch::tensor(expected, torch::kLong).to(torch::kFloat)).sum(1)));
  // DataProto's own index_select: the same rows, sent by the controller.
  const DataProto read_sent =
      reader_->call("read", fetched.select({"seq"}).index_select(torch::tensor(order, torch::kLong))).get();
  EXPECT_GE(ctl_->take_traffic().controller_sent_bytes, static_cast<uint64_t>(kSeqBytes));
  EXPECT_EQ(longs(read_sent.tensor("seq_sum")), longs(read.tensor("seq_sum")));
}

TEST_F(DataPlaneJob, ObjectsAreReleasedWithTheirLastHandle) {
  ASSERT_TRUE(held_becomes(maker_->pool(), 0)) << "earlier tests' objects were not released";
  Future made = maker_->call("make", batch(4));
  made.wait();
  ASSERT_TRUE(held_becomes(maker_->pool(), 2));  // one per producer rank
  torch::Tensor seq = made.get().tensor("seq");
  made = Future();
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // two heartbeats
  EXPECT_EQ(maker_->pool().held_objects().objects, 2) << "a fetched tensor still refers to the rows";
  seq = torch::Tensor();
  EXPECT_TRUE(held_becomes(maker_->pool(), 0));
}

TEST_F(DataPlaneJob, RanksThatCouldNotKeepTheirRowsSendThemAndConsumersStillGetThem) {
  // ONE_TO_ALL with 1 and 4 rows per rank through a table that holds 2 rows: rank 1 sends its output.
  Controller ctl;
  ResourcePool small = pool_spec("small_table", 2);
  small.object_table_bytes = 2 * 8 * 8;
  ctl.add_pools({small, pool_spec("readers", 1)});
  WorkerGroup maker = ctl.create_group("small_table", "maker", "maker");
  WorkerGroup reader = ctl.create_group("readers", "reader", "reader");
  Future uneven = maker.call("uneven");
  EXPECT_TRUE(uneven.held_on_workers());
  const DataProto read = reader.call("read", uneven).get();
  EXPECT_EQ(longs(read.tensor("seq_sum")), (std::vector<int64_t>{28, 828, 828, 828, 828}));
  EXPECT_TRUE(torch::equal(uneven.get().tensor("seq"), seq_of(torch::tensor({0.f, 1.f, 1.f, 1.f, 1.f}))));
}

TEST(DataPlane, OffTheSameTensorsReachTheSameMethods) {
  auto run = [](bool data_plane) {
    Controller ctl;
    ResourcePool a = pool_spec("a", 2), b = pool_spec("b", 3);
    a.data_plane = b.data_plane = data_plane;
    ctl.add_pools({a, b});
    WorkerGroup maker = ctl.create_group("a", "maker", "maker");
    WorkerGroup reader = ctl.create_group("b", "reader", "reader");
    Future made = maker.call("make", tagged_batch(6));
    DataProto read = reader.call("read", made).get();
    EXPECT_EQ(made.held_on_workers(), data_plane);
    read.erase_tensor("read_at");  // addresses differ from run to run
    return std::make_pair(made.get(), read);
  };
  const auto [made_on, read_on] = run(true);
  const auto [made_off, read_off] = run(false);
  for (const auto& [key, t] : made_off.tensors()) {
    if (key == "made_at") continue;
    EXPECT_TRUE(torch::equal(made_on.tensor(key), t)) << key;
  }
  EXPECT_EQ(made_on.tensors().size(), made_off.tensors().size());
  EXPECT_EQ(made_on.fields(), made_off.fields());
  for (const auto& [key, t] : read_off.tensors()) EXPECT_TRUE(torch::equal(read_on.tensor(key), t)) << key;
  EXPECT_EQ(read_on.fields(), read_off.fields());
}

TEST(DataPlane, OnOneMachineRowsAreMappedAndTheBytesEqualThoseSentOverTheSocket) {
  // Readers of 2 ranks take each producer rank's rows whole (the answer becomes the input, uncopied);
  // readers of 3 re-split them. "tcp" pools' consumers always ask over the data socket. All get the
  // producer's bytes exactly.
  Controller ctl;
  std::vector<ResourcePool> specs = {pool_spec("makers", 2)};
  for (const auto& [name, ranks] : std::vector<std::pair<std::string, int>>{{"shm2", 2}, {"shm3", 3}, {"tcp2", 2}, {"tcp3", 3}}) {
    specs.push_back(pool_spec(name, ranks));
    if (name.rfind("tcp", 0) == 0) specs.back().env["HF_DATA_PLANE_SHM"] = "0";
  }
  ctl.add_pools(specs);
  WorkerGroup maker = ctl.create_group("makers", "maker", "maker");
  std::vector<std::pair<std::string, WorkerGroup>> readers;
  for (const char* name : {"shm2", "shm3", "tcp2", "tcp3"}) readers.emplace_back(name, ctl.create_group(name, "reader", "reader"));
  std::set<std::string> shm_before;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) shm_before.insert(e.path().filename());
  for (const int64_t n : {int64_t{3000}, int64_t{6}}) {
    DataProto input;
    input.set_tensor("x", torch::rand({n}) * 1000);  // "wide" then has random float bits
    Future made = maker.call("make", input);
    const DataProto& expected = made.get();
    for (auto& [name, reader] : readers) {
      const DataProto got = reader.call("echo", made).get();
      for (const std::string key : {"seq", "wide"})
        EXPECT_TRUE(torch::equal(got.tensor(key), expected.tensor(key))) << key << " via " << name << ", " << n << " rows";
      // Mapped: every rank of shm2; the outer ranks of shm3 (the middle one's rows come from both producer
      // ranks and are copied into one tensor); none over the socket.
      std::vector<int64_t> mapped(static_cast<size_t>(n), name.rfind("shm", 0) == 0 ? 1 : 0);
      if (name == "shm3") std::fill(mapped.begin() + n / 3, mapped.begin() + 2 * n / 3, 0);
      EXPECT_EQ(longs(got.tensor("mapped")), mapped) << name << ", " << n << " rows";
    }
  }
  // The producers closed every file once its consumer mapped it; nothing was left in /dev/shm.
  auto files_open = [&] {
    int n = 0;
    for (int pid : maker.pool().pids()) n += open_row_files(pid);
    return n;
  };
  const auto t0 = std::chrono::steady_clock::now();
  while (files_open() > 0 && seconds_since(t0) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(files_open(), 0);
  std::set<std::string> shm_after;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm")) shm_after.insert(e.path().filename());
  EXPECT_EQ(shm_after, shm_before);
}

TEST(DataPlane, ADeadProducerIsAnErrorNamingItNotAHang) {
  Controller ctl;
  ResourcePool prod = pool_spec("dying", 1), cons = pool_spec("waiting", 1);
  prod.heartbeat_timeout_s = 60;  // the producer's pool must not notice the frozen worker first
  cons.data_fetch_timeout_s = 2;
  ctl.add_pools({prod, cons});
  WorkerGroup maker = ctl.create_group("dying", "maker", "maker");
  WorkerGroup reader = ctl.create_group("waiting", "reader", "reader");
  Future made = maker.call("make", batch(2));
  made.wait();
  const int pid = maker.pool().pids()[0];

  // Frozen: alive but silent, so only the consumer's fetch timeout can tell.
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  auto t0 = std::chrono::steady_clock::now();
  std::string message = message_of(reader.call("read", made));
  EXPECT_LT(seconds_since(t0), 20);
  for (const std::string& part : {std::string("role 'maker' rank 0"), "pid " + std::to_string(pid), std::string("no answer within")})
    EXPECT_NE(message.find(part), std::string::npos) << message;

  // Killed: an error naming it too, whether the consumer or the controller notices first.
  ASSERT_EQ(::kill(pid, SIGKILL), 0);
  t0 = std::chrono::steady_clock::now();
  message = message_of(reader.call("read", made));
  EXPECT_LT(seconds_since(t0), 20);
  EXPECT_NE(message.find(std::to_string(pid)), std::string::npos) << message;
  EXPECT_NE(message.find("maker"), std::string::npos) << message;
}

TEST(DataPlane, AStrangersFetchIsDroppedAndTheRunGoesOn) {
  Controller ctl;
  ctl.add_pools({pool_spec("holder", 1), pool_spec("asker", 1)});
  WorkerGroup maker = ctl.create_group("holder", "maker", "maker");
  WorkerGroup reader = ctl.create_group("asker", "reader", "reader");
  Future made = maker.call("make", batch(2));
  made.wait();
  const ProcessPool::RankInfo holder = maker.pool().rank_info(0);
  ASSERT_FALSE(holder.data_endpoint.empty());

  zmq::context_t context(1);
  zmq::socket_t stranger(context, zmq::socket_type::dealer);
  stranger.set(zmq::sockopt::linger, 0);
  stranger.connect(holder.data_endpoint);
  // A well-formed fetch under another secret (the object id is the pool's first call: 2 after the create).
  transport_detail::Link wrong("an-entirely-different-secret-of-32+chars", "data", 777,
                             transport_detail::Link::Ends::kPeers);
  transport_detail::Message fetch{"fetch",
                                {{"req", 1}, {"object", 2}, {"keys", {"seq"}}, {"runs", {{0, 2}}}},
                                std::nullopt};
  wrong.send(stranger, "", holder.node, fetch);
  stranger.send(zmq::str_buffer("junk"), zmq::send_flags::none);
  zmq::pollitem_t items[] = {{stranger.handle(), 0, ZMQ_POLLIN, 0}};
  EXPECT_EQ(zmq::poll(items, 1, std::chrono::milliseconds(500)), 0) << "a stranger got an answer";
  auto t0 = std::chrono::steady_clock::now();
  while (maker.pool().held_objects().rejected_requests < 2 && seconds_since(t0) < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(maker.pool().held_objects().rejected_requests, 2u);
  // The genuine consumer still gets its rows.
  EXPECT_EQ(longs(reader.call("read", made).get().tensor("seq_sum")), longs(seq_of(torch::arange(2, torch::kFloat)).sum(1)));
}

}  // namespace
