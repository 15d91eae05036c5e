// Rows handed over through shared memory on one machine (shared_rows.h): the consumer maps exactly the
// producer's bytes, its writes stay its own, the producer's descriptor closes on release or expiry, a file
// that is not what the reply names (another inode, resized, unsealed, writable, a slot of other size) is
// refused with an error saying so, files nobody released are bounded in bytes, and a producer that is
// gone, or on another machine, means "ask over the socket", with nothing left behind (memfds have no
// name: /dev/shm stays as it was).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <torch/torch.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <string>

#include "hybridflow/core/error.h"
#include "transport/shared_memory_test_support.h"
#include "transport/shared_rows.h"

using namespace hybridflow;
using namespace hybridflow::transport_detail;
using namespace hybridflow::transport_testing;
using json = nlohmann::json;

namespace {

std::string error_of(const json& reply) {
  try {
    SharedRowsMapping::open(reply);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

struct Rows {
  torch::Tensor seq = torch::arange(40, torch::kLong).reshape({5, 8});
  torch::Tensor wide = torch::rand({5, 3});
  // seq's rows in two pieces (two runs), wide's in one.
  std::vector<SharedRowsPart> parts() const {
    return {{"seq", seq.narrow(0, 0, 2)}, {"seq", seq.narrow(0, 2, 3)}, {"wide", wide}};
  }
};

}  // namespace

TEST(SharedRows, TheConsumerMapsExactlyTheProducersBytesAndReleaseClosesTheFile) {
  ASSERT_FALSE(shared_rows_machine().empty()) << "no boot id or pid namespace to name this machine by";
  const auto shm_before = dev_shm_names();
  Rows rows;
  SharedRowsOffers offers;
  const auto reply = offers.offer(/*consumer=*/7, /*req=*/1, rows.parts(), 60);
  ASSERT_TRUE(reply);
  EXPECT_EQ(offers.open(), 1u);
  EXPECT_EQ(open_shared_memory_files(::getpid()), 1);
  auto mapped = SharedRowsMapping::open(*reply);
  ASSERT_TRUE(mapped);
  const torch::Tensor seq = mapped->tensor("seq", torch::kLong, {5, 8});
  const torch::Tensor wide = mapped->tensor("wide", torch::kFloat, {5, 3});
  EXPECT_TRUE(torch::equal(seq, rows.seq));
  EXPECT_TRUE(torch::equal(wide, rows.wide));  // bit for bit
  // Released by another consumer or request: nothing closes; by its own: the descriptor goes, the
  // mapping (and the tensors) stay valid.
  offers.release(8, 1);
  offers.release(7, 2);
  EXPECT_EQ(offers.open(), 1u);
  offers.release(7, 1);
  EXPECT_EQ(offers.open(), 0u);
  EXPECT_EQ(open_shared_memory_files(::getpid()), 0);
  EXPECT_TRUE(torch::equal(seq, rows.seq));
  EXPECT_EQ(dev_shm_names(), shm_before);
}

TEST(SharedRows, WritesIntoAMappedInputStayInTheConsumer) {
  Rows rows;
  SharedRowsOffers offers;
  const auto reply = offers.offer(1, 1, rows.parts(), 60);
  ASSERT_TRUE(reply);
  auto first = SharedRowsMapping::open(*reply);
  ASSERT_TRUE(first);
  first->tensor("seq", torch::kLong, {5, 8}).add_(1000);
  auto second = SharedRowsMapping::open(*reply);
  ASSERT_TRUE(second);
  EXPECT_TRUE(torch::equal(second->tensor("seq", torch::kLong, {5, 8}), rows.seq));
  EXPECT_TRUE(torch::equal(first->tensor("seq", torch::kLong, {5, 8}), rows.seq + 1000));
}

TEST(SharedRows, OffersExpireWhenNoConsumerReleasesThem) {
  Rows rows;
  SharedRowsOffers offers;
  ASSERT_TRUE(offers.offer(1, 1, rows.parts(), 1.0));
  ASSERT_TRUE(offers.offer(1, 2, rows.parts(), 30.0));
  offers.expire();
  EXPECT_EQ(offers.open(), 2u);
  offers.expire(SharedRowsOffers::Clock::now() + std::chrono::seconds(2));
  EXPECT_EQ(offers.open(), 1u);
  offers.expire(SharedRowsOffers::Clock::now() + std::chrono::seconds(31));
  EXPECT_EQ(offers.open(), 0u);
  EXPECT_EQ(open_shared_memory_files(::getpid()), 0);
  // Nothing to write: no file, the rows go over the socket.
  EXPECT_FALSE(offers.offer(1, 3, {{"seq", torch::empty({0, 8}, torch::kLong)}}, 30.0));
}

TEST(SharedRows, FilesNobodyReleasedAreBoundedInBytes) {
  Rows rows;  // 320 + 60 bytes, slots on 64-byte boundaries: 384 bytes a file
  SharedRowsOffers offers(/*max_open_bytes=*/1000);
  ASSERT_TRUE(offers.offer(1, 1, rows.parts(), 60));
  ASSERT_TRUE(offers.offer(1, 2, rows.parts(), 60));
  EXPECT_FALSE(offers.offer(1, 3, rows.parts(), 60)) << "a third file would pass the bound";
  offers.release(1, 1);
  EXPECT_TRUE(offers.offer(1, 3, rows.parts(), 60));
}

TEST(SharedRows, AFileThatIsNotWhatTheReplyNamesIsRefused) {
  Rows rows;
  SharedRowsOffers offers;
  const json reply = *offers.offer(1, 1, rows.parts(), 60);
  auto expect_refused = [](const json& r, const std::string& why) {
    const std::string message = error_of(r);
    EXPECT_NE(message.find(why), std::string::npos) << "expected '" << why << "', got: '" << message << "'";
  };
  json truncated = reply;
  truncated["bytes"] = reply.at("bytes").get<size_t>() - 64;
  expect_refused(truncated, "truncated or grown");
  json other_inode = reply;
  other_inode["ino"] = reply.at("ino").get<uint64_t>() + 1;
  expect_refused(other_inode, "not the file the producer's reply names");
  json outside = reply;
  outside["slots"][0]["bytes"] = reply.at("bytes").get<size_t>() + 1;
  expect_refused(outside, "lies outside");

  // A file of the same name made by someone else, writable and unsealed: refused, whatever its bytes.
  const int fd = ::memfd_create("hf-rows", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  struct stat st {};
  ASSERT_EQ(::fstat(fd, &st), 0);
  json forged = reply;
  forged["fd"] = fd;
  forged["dev"] = static_cast<uint64_t>(st.st_dev);
  forged["ino"] = static_cast<uint64_t>(st.st_ino);
  forged["bytes"] = 4096;
  forged["slots"] = json::array({{{"key", "seq"}, {"offset", 0}, {"bytes", 320}}});
  expect_refused(forged, "not sealed");
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE), 0);
  expect_refused(forged, "writable");
  ::close(fd);

  // The genuine file, read as rows of another size: refused too.
  auto mapped = SharedRowsMapping::open(reply);
  ASSERT_TRUE(mapped);
  try {
    mapped->tensor("seq", torch::kLong, {4, 8});
    ADD_FAILURE() << "a slot of other size must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated?"), std::string::npos) << e.what();
  }
  EXPECT_THROW(mapped->tensor("nope", torch::kLong, {5, 8}), Error);
}

TEST(SharedRows, AGoneProducerOrAnotherMachineMeansAskingOverTheSocket) {
  const auto shm_before = dev_shm_names();
  Rows rows;
  SharedRowsOffers offers;
  json elsewhere = *offers.offer(1, 1, rows.parts(), 60);
  elsewhere["machine"] = "another-boot/0:0";
  EXPECT_FALSE(SharedRowsMapping::open(elsewhere));

  // A producer process that offers, then is killed before its consumer maps the file.
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(pipe_fds[0]);
    SharedRowsOffers own;
    const std::string text = own.offer(1, 1, Rows().parts(), 60)->dump() + "\n";
    [[maybe_unused]] auto n = ::write(pipe_fds[1], text.data(), text.size());
    ::pause();
    ::_exit(0);
  }
  ::close(pipe_fds[1]);
  std::string text;
  char c;
  while (::read(pipe_fds[0], &c, 1) == 1 && c != '\n') text += c;
  ::close(pipe_fds[0]);
  const json reply = json::parse(text);
  EXPECT_EQ(reply.at("pid").get<int64_t>(), child);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  EXPECT_FALSE(SharedRowsMapping::open(reply));  // its descriptor went with it, and the file with that
  EXPECT_EQ(dev_shm_names(), shm_before);
}
