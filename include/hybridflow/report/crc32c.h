// CRC32C (Castagnoli polynomial), the checksum TFRecord files carry for each record's length and data,
// and the "masked" form they store it in.
#pragma once

#include <cstdint>
#include <string_view>

namespace hybridflow::report {

// CRC32C of `data`, continuing from `crc` (the CRC of the bytes before), so that a message can be
// checksummed in pieces: crc32c(b, crc32c(a)) == crc32c(a + b).
uint32_t crc32c(std::string_view data, uint32_t crc = 0);

// TFRecord stores CRCs rotated and offset, because a CRC of data that itself contains CRCs is weak.
uint32_t mask_crc(uint32_t crc);
uint32_t unmask_crc(uint32_t masked);

}  // namespace hybridflow::report
