// A call's big tensors to a rank on this machine go through a sealed memory file (message.h): the rank
// decodes exactly the bytes the inline path gives, the controller's file closes with the rank's reply (or
// when the rank is forgotten), a file that is not the one the message names is refused with a clear
// reason, small payloads and messages that are no call stay inline, and /dev/shm is left as it was.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>
#include <torch/torch.h>

#include "transport/link_test_support.h"
#include "transport/shared_memory_test_support.h"

using namespace hybridflow;
using namespace hybridflow::transport_testing;
using transport_detail::kControllerEnd;
using transport_detail::kSharedFramesKey;
using transport_detail::Message;

namespace {

DataProto big_input() {
  torch::manual_seed(7);
  DataProto d;
  d.set_tensor("logits", torch::randn({256, 2048}));  // 2 MiB
  d.set_tensor("ids", torch::randint(0, 50000, {256, 1024}, torch::kLong));  // 2 MiB
  d.set_tensor("mask", torch::ones({256}, torch::kBool));  // small: inline
  d.meta()["note"] = "kept";
  return d;
}

// A controller and rank 0 on this machine, joined in-process, the rank's hello received.
struct Pair {
  SocketPair sockets;
  Link controller{kSecret, "pool:a", kControllerEnd};
  Link worker{kSecret, "pool:a", 0};
  std::string identity;
  Pair() {
    worker.send(sockets.dealer, "", kControllerEnd, hello(0));
    auto got = next(controller, sockets.router, true);
    EXPECT_TRUE(got && got->message);
    controller.commit(*got);
    identity = got->identity;
  }
  std::optional<Received> call(const Message& m) {
    controller.send(sockets.router, identity, 0, m);
    return next(worker, sockets.dealer, false);
  }
  void reply(int64_t call_id) {
    worker.send(sockets.dealer, "", kControllerEnd, {"result", {{"call_id", call_id}}, std::nullopt});
    auto got = next(controller, sockets.router, true);
    ASSERT_TRUE(got && got->message);
    controller.commit(*got);
  }
};

}  // namespace

TEST(SharedFrames, ACallThroughSharedMemoryDecodesToTheInlineBytesAndItsFileClosesWithTheReply) {
  ASSERT_FALSE(transport_detail::shared_rows_machine().empty()) << "no boot id or pid namespace: nothing to test";
  const auto shm_before = dev_shm_names();
  const int fds_before = open_shared_memory_files();
  const DataProto input = big_input();
  Pair inline_pair, shared_pair;
  shared_pair.controller.set_peer_machine(0, transport_detail::shared_rows_machine());

  auto inline_got = inline_pair.call({"call", {{"call_id", 1}}, input});
  ASSERT_TRUE(inline_got && inline_got->message) << (inline_got ? inline_got->rejected_reason : "nothing");
  auto shared_got = shared_pair.call({"call", {{"call_id", 1}}, input});
  ASSERT_TRUE(shared_got && shared_got->message) << (shared_got ? shared_got->rejected_reason : "nothing");
  EXPECT_GT(inline_got->bytes, size_t(4) << 20);
  EXPECT_LT(shared_got->bytes, size_t(64) << 10) << "the big tensors went over the socket";
  EXPECT_EQ(shared_got->tensor_bytes, inline_got->tensor_bytes);
  EXPECT_EQ(shared_pair.controller.shared_files_open(), 1u);
  EXPECT_EQ(open_shared_memory_files(), fds_before + 1);

  const DataProto& a = *inline_got->message->data;
  const DataProto& b = *shared_got->message->data;
  EXPECT_EQ(shared_got->message->meta, inline_got->message->meta) << "the file's name stays in the transport";
  EXPECT_FALSE(shared_got->message->meta.contains(kSharedFramesKey));
  EXPECT_EQ(b.meta(), a.meta());
  for (const std::string key : {"logits", "ids", "mask"}) {
    EXPECT_TRUE(same_bytes(a.tensor(key), input.tensor(key))) << key;
    EXPECT_TRUE(same_bytes(b.tensor(key), input.tensor(key))) << key;
  }
  // A method may write its input: its own pages change (copy on write), not the sender's tensor.
  const torch::Tensor original = input.tensor("logits").clone();
  b.tensor("logits").add_(1);
  EXPECT_TRUE(torch::equal(b.tensor("logits"), original + 1));
  EXPECT_TRUE(same_bytes(input.tensor("logits"), original));

  // A reply to a later call releases the earlier calls' files too.
  auto second = shared_pair.call({"call", {{"call_id", 2}}, input});
  ASSERT_TRUE(second && second->message);
  EXPECT_EQ(shared_pair.controller.shared_files_open(), 2u);
  shared_pair.reply(2);
  EXPECT_EQ(shared_pair.controller.shared_files_open(), 0u);
  EXPECT_EQ(open_shared_memory_files(), fds_before);
  EXPECT_EQ(dev_shm_names(), shm_before);
}

TEST(SharedFrames, SmallPayloadsMessagesThatAreNoCallAndOtherMachinesStayInline) {
  Pair p;
  p.controller.set_peer_machine(0, transport_detail::shared_rows_machine());
  DataProto small;
  small.set_tensor("x", torch::arange(1000));
  auto got = p.call({"call", {{"call_id", 1}}, small});
  ASSERT_TRUE(got && got->message);
  EXPECT_EQ(p.controller.shared_files_open(), 0u);
  // Without a call id nothing would release the file.
  got = p.call({"release", {}, big_input()});
  ASSERT_TRUE(got && got->message);
  EXPECT_EQ(p.controller.shared_files_open(), 0u);
  EXPECT_TRUE(same_bytes(got->message->data->tensor("ids"), big_input().tensor("ids")));
  p.controller.set_peer_machine(0, "another-boot/0:0");
  got = p.call({"call", {{"call_id", 2}}, big_input()});
  ASSERT_TRUE(got && got->message);
  EXPECT_EQ(p.controller.shared_files_open(), 0u);
}

TEST(SharedFrames, AForgottenRankClosesItsFiles) {
  const int fds_before = open_shared_memory_files();
  Pair p;
  p.controller.set_peer_machine(0, transport_detail::shared_rows_machine());
  for (int64_t id = 1; id <= 3; ++id)
    p.controller.send(p.sockets.router, p.identity, 0, {"call", {{"call_id", id}}, big_input()});
  EXPECT_EQ(p.controller.shared_files_open(), 3u);
  p.controller.forget_peer(0);  // the pool saw the rank die
  EXPECT_EQ(p.controller.shared_files_open(), 0u);
  EXPECT_EQ(open_shared_memory_files(), fds_before);
  // And it gets inline frames from now on.
  p.controller.send(p.sockets.router, p.identity, 0, {"call", {{"call_id", 4}}, big_input()});
  std::optional<Received> got;
  int refused = 0;  // the three calls before: their files are gone
  do {
    got = next(p.worker, p.sockets.dealer, false);
    if (got && !got->message) ++refused;
  } while (got && !(got->message && got->message->meta.value("call_id", 0) == 4));
  ASSERT_TRUE(got && got->message);
  EXPECT_EQ(refused, 3);
  EXPECT_GT(got->bytes, size_t(4) << 20);
}

// The descriptor the message names is swapped for another file (what a process of the same user could do
// between send and receive): the rank refuses the message, saying why, instead of decoding other bytes.
TEST(SharedFrames, AFileThatIsNotTheOneTheMessageNamesIsRefused) {
  Pair p;
  p.controller.set_peer_machine(0, transport_detail::shared_rows_machine());
  p.controller.send(p.sockets.router, p.identity, 0, {"call", {{"call_id", 1}}, big_input()});
  const auto frames = record(p.sockets.dealer);
  const auto named = nlohmann::json::parse(frames.at(2)).at(kSharedFramesKey);
  const int fd = named.at("fd").get<int>();
  const int other = ::memfd_create("hf-rows", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  ASSERT_EQ(::ftruncate(other, named.at("bytes").get<off_t>()), 0);
  ASSERT_EQ(::dup2(other, fd), fd);  // writable, unsealed, another inode
  ::close(other);
  zmq::socket_t in(p.sockets.context, zmq::socket_type::pair), out(p.sockets.context, zmq::socket_type::pair);
  in.bind("inproc://swapped");
  out.connect("inproc://swapped");
  send_raw(out, frames);
  auto got = next(p.worker, in, false);
  ASSERT_TRUE(got);
  EXPECT_FALSE(got->message);
  EXPECT_EQ(got->reject_code, "refused-file");
  EXPECT_NE(got->rejected_reason.find("not the file"), std::string::npos) << got->rejected_reason;
}
