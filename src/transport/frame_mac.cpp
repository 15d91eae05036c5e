#include "frame_mac.h"

#include <algorithm>
#include <bit>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "hybridflow/core/error.h"

namespace hybridflow::transport_detail {

static_assert(std::endian::native == std::endian::little, "NH reads the frames' words little-endian");

namespace {

constexpr size_t kNhBlockBytes = 32;           // NH pairs word j with word j + 4 of each 32-byte block
constexpr size_t kDigestBatchBytes = 4096;     // NH digests handed to Poly1305 at once
constexpr char kFrameMacContext[] = "hfmsg_v2";  // crypto_kdf context: exactly 8 characters

uint32_t nh_word(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Both iterations over whole blocks; iteration two uses the key shifted by 4 words (Toeplitz).
void nh_blocks_portable(const uint32_t* k, const unsigned char* m, size_t blocks, uint64_t acc[2]) {
  for (size_t b = 0; b < blocks; ++b, m += kNhBlockBytes, k += 8) {
    for (int j = 0; j < 4; ++j) {
      const uint32_t lo = nh_word(m + 4 * j), hi = nh_word(m + 16 + 4 * j);
      acc[0] += static_cast<uint64_t>(static_cast<uint32_t>(lo + k[j])) * static_cast<uint32_t>(hi + k[j + 4]);
      acc[1] += static_cast<uint64_t>(static_cast<uint32_t>(lo + k[j + 4])) * static_cast<uint32_t>(hi + k[j + 8]);
    }
  }
}

#if defined(__SSE2__)
void nh_blocks_sse2(const uint32_t* k, const unsigned char* m, size_t blocks, uint64_t acc[2]) {
  __m128i a0 = _mm_setzero_si128(), a1 = _mm_setzero_si128();
  for (size_t b = 0; b < blocks; ++b, m += kNhBlockBytes, k += 8) {
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 16));
    const __m128i k0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k));
    const __m128i k1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 4));
    const __m128i k2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(k + 8));
    // _mm_mul_epu32 multiplies the even 32-bit lanes; the shifted copies bring the odd ones there.
    __m128i x = _mm_add_epi32(lo, k0), y = _mm_add_epi32(hi, k1);
    a0 = _mm_add_epi64(a0, _mm_mul_epu32(x, y));
    a0 = _mm_add_epi64(a0, _mm_mul_epu32(_mm_srli_epi64(x, 32), _mm_srli_epi64(y, 32)));
    x = _mm_add_epi32(lo, k1);
    y = _mm_add_epi32(hi, k2);
    a1 = _mm_add_epi64(a1, _mm_mul_epu32(x, y));
    a1 = _mm_add_epi64(a1, _mm_mul_epu32(_mm_srli_epi64(x, 32), _mm_srli_epi64(y, 32)));
  }
  uint64_t lanes[2];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), a0);
  acc[0] += lanes[0] + lanes[1];
  _mm_storeu_si128(reinterpret_cast<__m128i*>(lanes), a1);
  acc[1] += lanes[0] + lanes[1];
}
#endif

using NhBlocksFn = void (*)(const uint32_t*, const unsigned char*, size_t, uint64_t*);

// A chunk is its whole blocks, then its last partial block zero-padded (the frame's length is in the MAC).
std::array<uint64_t, 2> nh_chunk_with(NhBlocksFn blocks_fn, const uint32_t* key, const unsigned char* data,
                                      size_t size) {
  HF_CHECK(size <= kNhChunkBytes, "NH chunk of ", size, " bytes (at most ", kNhChunkBytes, ")");
  uint64_t acc[2] = {0, 0};
  const size_t whole = size / kNhBlockBytes;
  blocks_fn(key, data, whole, acc);
  if (const size_t rest = size % kNhBlockBytes; rest > 0) {
    unsigned char padded[kNhBlockBytes] = {};
    std::memcpy(padded, data + whole * kNhBlockBytes, rest);
    blocks_fn(key + 8 * whole, padded, 1, acc);
  }
  return {acc[0], acc[1]};
}

void put_le64(unsigned char* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace

std::array<uint64_t, 2> nh_chunk_portable(const uint32_t* key, const unsigned char* data, size_t size) {
  return nh_chunk_with(nh_blocks_portable, key, data, size);
}

std::array<uint64_t, 2> nh_chunk(const uint32_t* key, const unsigned char* data, size_t size) {
#if defined(__SSE2__)
  return nh_chunk_with(nh_blocks_sse2, key, data, size);
#else
  return nh_chunk_with(nh_blocks_portable, key, data, size);
#endif
}

FrameMacKey::FrameMacKey(const std::string& secret) {
  HF_CHECK(sodium_init() >= 0, "libsodium failed to initialise (sodium_init); messages cannot be authenticated");
  HF_CHECK(!secret.empty(), "message authentication: empty job secret");
  // A hash of the secret is the master key, so the secret itself is never usable from a key; the PRF key
  // and the NH key are independent subkeys of it.
  static const char kLabel[] = "hybridflow message key v2";
  unsigned char master[crypto_kdf_KEYBYTES];
  crypto_generichash_state hash;
  crypto_generichash_init(&hash, nullptr, 0, sizeof(master));
  crypto_generichash_update(&hash, reinterpret_cast<const unsigned char*>(kLabel), sizeof(kLabel) - 1);
  crypto_generichash_update(&hash, reinterpret_cast<const unsigned char*>(secret.data()), secret.size());
  crypto_generichash_final(&hash, master, sizeof(master));
  static_assert(sizeof(kFrameMacContext) - 1 == crypto_kdf_CONTEXTBYTES);
  crypto_kdf_derive_from_key(prf_key_.data(), prf_key_.size(), 1, kFrameMacContext, master);
  unsigned char nh_seed[crypto_stream_chacha20_KEYBYTES];
  crypto_kdf_derive_from_key(nh_seed, sizeof(nh_seed), 2, kFrameMacContext, master);
  const unsigned char zero_nonce[crypto_stream_chacha20_NONCEBYTES] = {};  // the seed is used once
  crypto_stream_chacha20(reinterpret_cast<unsigned char*>(nh_key_.data()), sizeof(nh_key_), zero_nonce, nh_seed);
  sodium_memzero(nh_seed, sizeof(nh_seed));
  sodium_memzero(master, sizeof(master));
  sodium_memzero(&hash, sizeof(hash));
}

FrameMacKey::~FrameMacKey() {
  sodium_memzero(prf_key_.data(), prf_key_.size());
  sodium_memzero(nh_key_.data(), sizeof(nh_key_));
}

FrameMac::FrameMac(const FrameMacKey& key, const unsigned char* header, size_t header_size) : key_(key) {
  unsigned char one_time_key[crypto_onetimeauth_KEYBYTES];
  crypto_generichash(one_time_key, sizeof(one_time_key), header, header_size, key.prf_key_.data(),
                     key.prf_key_.size());
  crypto_onetimeauth_init(&state_, one_time_key);
  sodium_memzero(one_time_key, sizeof(one_time_key));
  digests_.reserve(kDigestBatchBytes + 32);
}

FrameMac::~FrameMac() { sodium_memzero(&state_, sizeof(state_)); }

namespace {

// The length first, so frame boundaries cannot shift and a zero-padded chunk is not its unpadded self.
void append_frame_length(std::vector<unsigned char>& out, size_t size) {
  unsigned char entry[8];
  put_le64(entry, size);
  out.insert(out.end(), entry, entry + 8);
}

void append_chunk_digest(const uint32_t* nh_key, const unsigned char* chunk, size_t size,
                         std::vector<unsigned char>& out) {
  const auto digest = nh_chunk(nh_key, chunk, size);
  unsigned char entry[16];
  put_le64(entry, digest[0]);
  put_le64(entry + 8, digest[1]);
  out.insert(out.end(), entry, entry + 16);
}

}  // namespace

void FrameMac::add_frame(const void* data, size_t size) {
  append_frame_length(digests_, size);
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t at = 0; at < size; at += kNhChunkBytes) {
    append_chunk_digest(key_.nh_key_.data(), bytes + at, std::min(kNhChunkBytes, size - at), digests_);
    if (digests_.size() >= kDigestBatchBytes) flush_digests();
  }
}

void FrameMac::digest_frame(const FrameMacKey& key, const void* data, size_t size, std::vector<unsigned char>& out) {
  append_frame_length(out, size);
  const auto* bytes = static_cast<const unsigned char*>(data);
  for (size_t at = 0; at < size; at += kNhChunkBytes)
    append_chunk_digest(key.nh_key_.data(), bytes + at, std::min(kNhChunkBytes, size - at), out);
}

void FrameMac::add_digests(const unsigned char* digests, size_t size) {
  // Poly1305 streams: how its input is split between updates does not change the tag.
  flush_digests();
  crypto_onetimeauth_update(&state_, digests, size);
}

void FrameMac::flush_digests() {
  crypto_onetimeauth_update(&state_, digests_.data(), digests_.size());
  digests_.clear();
}

void FrameMac::finish(unsigned char tag[kFrameTagBytes]) {
  flush_digests();
  crypto_onetimeauth_final(&state_, tag);
}

}  // namespace hybridflow::transport_detail
