#include "hybridflow/report/protobuf_encoder.h"

#include <bit>

namespace hybridflow::report {
namespace {
constexpr int kWireVarint = 0, kWireFixed64 = 1, kWireLengthDelimited = 2, kWireFixed32 = 5;
}

void ProtobufEncoder::tag(int field, int wire_type) {
  varint((static_cast<uint64_t>(field) << 3) | static_cast<uint64_t>(wire_type));
}

void ProtobufEncoder::varint(uint64_t value) {
  // Seven bits per byte, low groups first; the top bit says another byte follows.
  while (value >= 0x80) {
    out_.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out_.push_back(static_cast<char>(value));
}

void ProtobufEncoder::little_endian(uint64_t value, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) out_.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

ProtobufEncoder& ProtobufEncoder::varint_field(int field, uint64_t value) {
  tag(field, kWireVarint);
  varint(value);
  return *this;
}

ProtobufEncoder& ProtobufEncoder::double_field(int field, double value) {
  tag(field, kWireFixed64);
  little_endian(std::bit_cast<uint64_t>(value), 8);
  return *this;
}

ProtobufEncoder& ProtobufEncoder::float_field(int field, float value) {
  tag(field, kWireFixed32);
  little_endian(std::bit_cast<uint32_t>(value), 4);
  return *this;
}

ProtobufEncoder& ProtobufEncoder::bytes_field(int field, std::string_view bytes) {
  tag(field, kWireLengthDelimited);
  varint(bytes.size());
  out_.append(bytes);
  return *this;
}

}  // namespace hybridflow::report
