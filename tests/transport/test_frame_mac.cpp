// The message MAC (frame_mac.h): its fast NH path agrees with the portable one, and the tag changes with
// every byte, every frame boundary, the header and the secret.
#include <gtest/gtest.h>

#include <random>

#include "transport/frame_mac.h"

using namespace hybridflow::transport_detail;

namespace {

std::vector<unsigned char> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<unsigned char> out(n);
  for (auto& b : out) b = static_cast<unsigned char>(gen());
  return out;
}

using Tag = std::array<unsigned char, kFrameTagBytes>;

Tag tag_of(const FrameMacKey& key, const std::string& header, const std::vector<std::vector<unsigned char>>& frames) {
  FrameMac mac(key, reinterpret_cast<const unsigned char*>(header.data()), header.size());
  for (const auto& f : frames) mac.add_frame(f.data(), f.size());
  Tag tag;
  mac.finish(tag.data());
  return tag;
}

}  // namespace

TEST(FrameMac, FastNhAgreesWithThePortableOneForEverySize) {
  const auto key_bytes = random_bytes(kNhKeyWords * 4, 1);
  std::vector<uint32_t> key(kNhKeyWords);
  std::memcpy(key.data(), key_bytes.data(), key_bytes.size());
  for (size_t size : {0, 1, 4, 31, 32, 33, 100, 1000, 1023, 1024}) {
    const auto data = random_bytes(size, static_cast<uint32_t>(size) + 7);
    EXPECT_EQ(nh_chunk(key.data(), data.data(), size), nh_chunk_portable(key.data(), data.data(), size)) << size;
  }
  const std::vector<unsigned char> ones(1024, 0xff);  // every addition and product wraps
  EXPECT_EQ(nh_chunk(key.data(), ones.data(), 1024), nh_chunk_portable(key.data(), ones.data(), 1024));
}

TEST(FrameMac, TagChangesWithAnyByteFrameBoundaryHeaderOrSecret) {
  const FrameMacKey key("5c8e1f0a7b3d4e6f9a2c1b8d7e0f3a4c"), other("another-jobs-secret-0a1b2c3d4e5f6789");
  const std::string header = "HFm2 pool:a 0 -1 17";
  const auto big = random_bytes(5 * kNhChunkBytes + 77, 3);  // whole chunks and a partial one
  const std::vector<std::vector<unsigned char>> frames = {{'c', 'a', 'l', 'l'}, big};
  const Tag genuine = tag_of(key, header, frames);
  EXPECT_EQ(tag_of(key, header, frames), genuine) << "the tag is a function of its inputs";

  for (size_t at : {size_t(0), size_t(31), kNhChunkBytes, 3 * kNhChunkBytes + 500, big.size() - 1}) {
    auto tampered = frames;
    tampered[1][at] ^= 0x01;
    EXPECT_NE(tag_of(key, header, tampered), genuine) << "byte " << at << " of the payload flipped";
  }
  auto padded = frames;
  padded[1].push_back(0);  // a zero byte appended lands in the zero padding of the last chunk
  EXPECT_NE(tag_of(key, header, padded), genuine);
  auto truncated = frames;
  truncated[1].pop_back();
  EXPECT_NE(tag_of(key, header, truncated), genuine);
  EXPECT_NE(tag_of(key, header, {{'c', 'a', 'l'}, {'l'}, big}), tag_of(key, header, {{'c', 'a'}, {'l', 'l'}, big}))
      << "moving a frame boundary changes the tag";
  EXPECT_NE(tag_of(key, header, {frames[0]}), tag_of(key, header, {frames[0], {}})) << "an empty frame counts";
  EXPECT_NE(tag_of(key, "HFm2 pool:a 0 -1 18", frames), genuine) << "another sequence number";
  EXPECT_NE(tag_of(other, header, frames), genuine) << "another secret";
}

TEST(FrameMac, EmptySecretIsRefused) { EXPECT_ANY_THROW(FrameMacKey key("")); }
