// The message layer's authentication: a round trip, then forged, tampered, replayed, reflected and
// oversized messages, each rejected with its own code.
#include <cstdlib>

// Small enough that a test can exceed it cheaply; set before anything reads it.
static const bool kSmallMessageLimit = (::setenv("HF_MAX_MESSAGE_BYTES", "262144", 1), true);

#include <torch/torch.h>

#include "transport/link_test_support.h"

using namespace hybridflow;
using namespace hybridflow::transport_testing;
using transport_detail::kControllerEnd;

TEST(MessageLink, RoundTripAuthenticatesTheSenderAndKeepsThePayload) {
  SocketPair p;
  Link controller(kSecret, "pool:a", kControllerEnd), worker(kSecret, "pool:a", 3);
  DataProto data;
  data.set_tensor("x", torch::arange(5));
  worker.send(p.dealer, "", kControllerEnd, {"result", {{"call_id", 1}}, data});
  auto got = next(controller, p.router, true);
  ASSERT_TRUE(got && got->message) << (got ? got->rejected_reason : "nothing");
  EXPECT_EQ(got->sender, 3);
  EXPECT_EQ(got->message->kind, "result");
  EXPECT_TRUE(torch::equal(got->message->data->tensor("x"), torch::arange(5)));
  // And back, to the identity the message came from.
  controller.send(p.router, got->identity, 3, {"welcome", {}, std::nullopt});
  auto back = next(worker, p.dealer, false);
  ASSERT_TRUE(back && back->message) << (back ? back->rejected_reason : "nothing");
  EXPECT_EQ(back->message->kind, "welcome");
}

TEST(MessageLink, ForgedTamperedReplayedReflectedAndOtherScopeMessagesAreRejected) {
  SocketPair p;
  Link controller(kSecret, "pool:a", kControllerEnd), worker(kSecret, "pool:a", 0);
  Link stranger("another-jobs-secret-0a1b2c3d4e5f6789", "pool:a", 0), other_pool(kSecret, "pool:b", 0);

  stranger.send(p.dealer, "", kControllerEnd, hello(0));
  auto got = next(controller, p.router, true);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->reject_code, "forged") << got->rejected_reason;

  other_pool.send(p.dealer, "", kControllerEnd, hello(0));
  EXPECT_EQ(next(controller, p.router, true)->reject_code, "forged") << "a message of pool b is not one of pool a";

  // Tampering: the eavesdropper changes the meta of a genuine message.
  worker.send(p.dealer, "", kControllerEnd, hello(0));
  auto frames = record(p.router);
  ASSERT_EQ(frames.size(), 4u);  // identity, auth, kind, meta
  frames[3] = R"({"rank":0,"host":"x"})";
  zmq::socket_t replayer = intruder(p.context, "inproc://pair");
  send_raw(replayer, {frames.begin() + 1, frames.end()});
  EXPECT_EQ(next(controller, p.router, true)->reject_code, "forged");

  // Replay: a genuine message accepted once is refused the second time.
  worker.send(p.dealer, "", kControllerEnd, hello(0));
  frames = record(p.router);
  send_raw(replayer, {frames.begin() + 1, frames.end()});
  auto first = next(controller, p.router, true);
  ASSERT_TRUE(first && first->message) << first->rejected_reason;
  controller.commit(*first);  // what a pool does once the sender's connection checks out
  send_raw(replayer, {frames.begin() + 1, frames.end()});
  auto again = next(controller, p.router, true);
  EXPECT_EQ(again->reject_code, "replayed") << again->rejected_reason;

  // Reflection: the controller's own message sent back to it is not from a rank.
  controller.send(p.router, first->identity, 0, {"call", {{"call_id", 9}}, std::nullopt});
  auto to_worker = record(replayer);
  send_raw(replayer, to_worker);
  EXPECT_EQ(next(controller, p.router, true)->reject_code, "forged");
  // Without the hybridflow frame at all (an old or foreign client).
  send_raw(replayer, {"token", "result", "{}"});
  EXPECT_EQ(next(controller, p.router, true)->reject_code, "malformed");
}

TEST(MessageLink, TamperedTensorPayloadNonceOrTagIsRejected) {
  SocketPair p;
  Link controller(kSecret, "pool:a", kControllerEnd), worker(kSecret, "pool:a", 0);
  zmq::socket_t replayer = intruder(p.context, "inproc://pair");
  DataProto data;
  data.set_tensor("x", torch::arange(20000, torch::kFloat32));  // 80 KB: many MAC chunks
  // Each variant changes one byte of a genuine message that has not been delivered: the last byte of the
  // tensor, its first byte, the link nonce (auth bytes 16..31) and the tag (the last 16 auth bytes).
  for (const auto& [frame, byte] : std::vector<std::pair<int, int>>{{5, -1}, {5, 0}, {1, 16}, {1, 40}}) {
    worker.send(p.dealer, "", kControllerEnd, {"result", {{"call_id", 1}}, data});
    auto frames = record(p.router);
    ASSERT_EQ(frames.size(), 6u);  // identity, auth, kind, meta, DataProto header, the tensor
    auto& f = frames[frame];
    f[byte < 0 ? f.size() - 1 : static_cast<size_t>(byte)] ^= 0x40;
    send_raw(replayer, {frames.begin() + 1, frames.end()});
    auto got = next(controller, p.router, true);
    ASSERT_TRUE(got);
    EXPECT_EQ(got->reject_code, "forged") << "frame " << frame << " byte " << byte;
  }
  // Untouched, the same message passes.
  worker.send(p.dealer, "", kControllerEnd, {"result", {{"call_id", 2}}, data});
  auto got = next(controller, p.router, true);
  ASSERT_TRUE(got && got->message) << (got ? got->rejected_reason : "nothing");
  EXPECT_TRUE(torch::equal(got->message->data->tensor("x"), torch::arange(20000, torch::kFloat32)));
}

TEST(MessageLink, OversizedMessageIsDroppedBeforeDecoding) {
  ASSERT_EQ(transport_detail::max_message_bytes(), 262144u);
  SocketPair p;
  Link controller(kSecret, "pool:a", kControllerEnd), worker(kSecret, "pool:a", 0);
  // Many frames below the per-frame limit, together above the message limit.
  zmq::socket_t flood = intruder(p.context, "inproc://pair");
  const std::string chunk(100000, 'x');
  send_raw(flood, {chunk, chunk, chunk});
  auto got = next(controller, p.router, true);
  ASSERT_TRUE(got);
  EXPECT_EQ(got->reject_code, "oversized") << got->rejected_reason;
  EXPECT_NE(got->rejected_reason.find("HF_MAX_MESSAGE_BYTES"), std::string::npos);
  // The socket is still usable: the next genuine message arrives.
  worker.send(p.dealer, "", kControllerEnd, hello(0));
  got = next(controller, p.router, true);
  EXPECT_TRUE(got && got->message);
}


// A one-to-all request: its content is encoded and digested once, yet each receiver's message carries its
// own sequence number and tag. Every copy is accepted by its receiver; a copy for rank 0 is forged for
// rank 1, and a changed byte of the shared payload is caught.
TEST(MessageLink, SharedContentIsAuthenticatedPerReceiver) {
  SocketPair p;
  Link controller(kSecret, "pool:a", kControllerEnd), worker0(kSecret, "pool:a", 0);
  worker0.send(p.dealer, "", kControllerEnd, hello(0));  // so that the ROUTER knows the worker's identity
  auto got_hello = next(controller, p.router, true);
  ASSERT_TRUE(got_hello && got_hello->message);
  DataProto data;
  data.set_tensor("x", torch::arange(20000, torch::kFloat32));  // 80 KB: many MAC chunks
  auto shared = std::make_shared<transport_detail::SharedContent>(
      transport_detail::Message{"call", {{"call_id", 7}}, data});
  const transport_detail::Message to_all{"", nlohmann::json::object(), std::nullopt, shared};

  // Two copies to rank 0, as two calls would: each accepted, the payload intact.
  std::vector<std::vector<std::string>> copies;
  for (int i = 0; i < 2; ++i) {
    controller.send(p.router, got_hello->identity, 0, to_all);
    copies.push_back(record(p.dealer));
  }
  ASSERT_EQ(copies[0].size(), 5u);  // auth, kind, meta, DataProto header, the tensor
  EXPECT_NE(copies[0][0], copies[1][0]) << "each copy has its own sequence number and tag";
  EXPECT_EQ(copies[0][4], copies[1][4]);
  zmq::socket_t in(p.context, zmq::socket_type::pair), out(p.context, zmq::socket_type::pair);
  in.bind("inproc://copies");
  out.connect("inproc://copies");
  for (const auto& copy : copies) {
    send_raw(out, copy);
    auto got = next(worker0, in, false);
    ASSERT_TRUE(got && got->message) << (got ? got->rejected_reason : "nothing");
    EXPECT_EQ(got->message->kind, "call");
    EXPECT_EQ(got->message->meta.at("call_id"), 7);
    EXPECT_TRUE(torch::equal(got->message->data->tensor("x"), torch::arange(20000, torch::kFloat32)));
  }

  // The same copy handed to rank 1 (whose own copy it is not): forged.
  Link worker1(kSecret, "pool:a", 1);
  controller.send(p.router, got_hello->identity, 0, to_all);
  auto for_rank0 = record(p.dealer);
  send_raw(out, for_rank0);
  auto stolen = next(worker1, in, false);
  ASSERT_TRUE(stolen);
  EXPECT_EQ(stolen->reject_code, "forged") << "a copy for rank 0 must not pass as one for rank 1";

  // A byte of the shared payload changed on the way to rank 0: forged; the copy untouched passes.
  auto tampered = for_rank0;
  tampered[4][100] ^= 0x40;
  send_raw(out, tampered);
  auto bad = next(worker0, in, false);
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->reject_code, "forged");
  send_raw(out, for_rank0);
  auto good = next(worker0, in, false);
  ASSERT_TRUE(good && good->message) << (good ? good->rejected_reason : "nothing");
}
