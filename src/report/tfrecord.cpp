#include "hybridflow/report/tfrecord.h"

#include <cstdint>

#include "hybridflow/core/error.h"
#include "hybridflow/report/crc32c.h"

namespace hybridflow::report {
namespace {

constexpr size_t kLengthBytes = 8, kCrcBytes = 4;

void append_le(std::string& out, uint64_t value, size_t n_bytes) {
  for (size_t i = 0; i < n_bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t read_le(std::string_view bytes, size_t n_bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < n_bytes; ++i) value |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  return value;
}

}  // namespace

std::string frame_tfrecord(std::string_view data) {
  std::string out;
  out.reserve(kLengthBytes + kCrcBytes + data.size() + kCrcBytes);
  append_le(out, data.size(), kLengthBytes);
  append_le(out, mask_crc(crc32c(std::string_view(out).substr(0, kLengthBytes))), kCrcBytes);
  out.append(data);
  append_le(out, mask_crc(crc32c(data)), kCrcBytes);
  return out;
}

std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& source) {
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset < bytes.size()) {
    const std::string_view rest = bytes.substr(offset);
    HF_CHECK(rest.size() >= kLengthBytes + kCrcBytes, source, ": record at byte ", offset,
             " is cut off in its header (", rest.size(), " bytes left)");
    const std::string_view length_bytes = rest.substr(0, kLengthBytes);
    HF_CHECK(unmask_crc(static_cast<uint32_t>(read_le(rest.substr(kLengthBytes), kCrcBytes))) == crc32c(length_bytes),
             source, ": record at byte ", offset, " has a corrupted length (its CRC does not match)");
    const uint64_t length = read_le(length_bytes, kLengthBytes);
    const size_t header = kLengthBytes + kCrcBytes;
    HF_CHECK(length <= rest.size() - header && rest.size() - header - length >= kCrcBytes, source,
             ": record at byte ", offset, " is cut off (", length, " data bytes announced, ", rest.size() - header,
             " left)");
    const std::string_view data = rest.substr(header, length);
    HF_CHECK(unmask_crc(static_cast<uint32_t>(read_le(rest.substr(header + length), kCrcBytes))) == crc32c(data),
             source, ": record at byte ", offset, " has corrupted data (its CRC does not match)");
    records.emplace_back(data);
    offset += header + length + kCrcBytes;
  }
  return records;
}

}  // namespace hybridflow::report
