// The message authentication code of every controller <-> worker and worker <-> worker message, fast
// enough for tensor payloads (docs/security.md). A Wegman-Carter MAC:
//   tag = Poly1305(one-time key, for each frame: its length, then NH digests of its 1 KiB chunks)
//   one-time key = keyed BLAKE2b(PRF key, header naming scope, sender, receiver, sequence number, nonce)
// NH (the universal hash of UMAC, RFC 4418, two Toeplitz iterations: collision probability 2^-64 per
// chunk) runs at memory speed; Poly1305 then reads 1/64 of the bytes. The NH key is secret and the same
// for every message; each message's tag is masked by its own one-time key, so tags reveal nothing of it.
// Both keys are derived from the job secret, which itself never travels.
#pragma once

#include <sodium.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace hybridflow::transport_detail {

inline constexpr size_t kNhChunkBytes = 1024;
inline constexpr size_t kNhKeyWords = kNhChunkBytes / 4 + 4;  // one chunk, plus the second iteration's shift
inline constexpr size_t kFrameTagBytes = crypto_onetimeauth_BYTES;

// NH digests of one chunk of at most kNhChunkBytes (zero-padded to a multiple of 32 bytes): the fast path
// (SSE2 where the CPU has it) and a portable one that must agree with it bit for bit.
std::array<uint64_t, 2> nh_chunk(const uint32_t* key, const unsigned char* data, size_t size);
std::array<uint64_t, 2> nh_chunk_portable(const uint32_t* key, const unsigned char* data, size_t size);

// The keys of one job secret: derive once per link (it hashes the secret), share between its messages.
class FrameMacKey {
 public:
  explicit FrameMacKey(const std::string& secret);
  ~FrameMacKey();
  FrameMacKey(const FrameMacKey&) = delete;
  FrameMacKey& operator=(const FrameMacKey&) = delete;

 private:
  friend class FrameMac;
  std::array<unsigned char, crypto_generichash_KEYBYTES> prf_key_{};
  std::array<uint32_t, kNhKeyWords> nh_key_{};
};

// The tag of one message: construct with the message's header (everything that names the conversation
// and the sender's position in it), add every content frame in order, then finish.
class FrameMac {
 public:
  FrameMac(const FrameMacKey& key, const unsigned char* header, size_t header_size);
  ~FrameMac();
  FrameMac(const FrameMac&) = delete;
  FrameMac& operator=(const FrameMac&) = delete;
  void add_frame(const void* data, size_t size);
  // What add_frame feeds the MAC for one frame (its length, then the NH digests of its chunks). It depends
  // on the key alone, not on the message's header: a frame sent to many receivers is digested once, and
  // add_digests then gives each receiver's MAC the same bytes, for the same tag add_frame would give.
  static void digest_frame(const FrameMacKey& key, const void* data, size_t size, std::vector<unsigned char>& out);
  void add_digests(const unsigned char* digests, size_t size);
  void finish(unsigned char tag[kFrameTagBytes]);

 private:
  void flush_digests();
  const FrameMacKey& key_;
  crypto_onetimeauth_state state_;
  std::vector<unsigned char> digests_;  // NH digests waiting for Poly1305, fed in batches
};

}  // namespace hybridflow::transport_detail
