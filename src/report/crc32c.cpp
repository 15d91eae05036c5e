#include "hybridflow/report/crc32c.h"

#include <array>

namespace hybridflow::report {
namespace {

// The Castagnoli polynomial 0x1EDC6F41, bit-reversed because the CRC is computed least significant bit first.
constexpr uint32_t kPolyReflected = 0x82F63B78u;
constexpr uint32_t kMaskDelta = 0xa282ead8u;

// One table entry per byte value: the CRC register after shifting that byte through it.
constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t byte = 0; byte < 256; ++byte) {
    uint32_t crc = byte;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ kPolyReflected : crc >> 1;
    table[byte] = crc;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c(std::string_view data, uint32_t crc) {
  crc = ~crc;
  for (unsigned char c : data) crc = kTable[(crc ^ c) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

uint32_t mask_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

uint32_t unmask_crc(uint32_t masked) {
  const uint32_t rotated = masked - kMaskDelta;
  return (rotated >> 17) | (rotated << 15);
}

}  // namespace hybridflow::report
