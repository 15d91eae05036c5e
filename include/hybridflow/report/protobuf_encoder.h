// A protocol-buffer encoder for the few field kinds TensorBoard's Event messages use, so that event
// files need no protobuf library or generated code. Fields are appended in the order they are
// called; nested messages are encoded separately and added as bytes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hybridflow::report {

class ProtobufEncoder {
 public:
  // int64/uint64/enum fields (wire type 0). Negative int64 values take ten bytes, as protobuf specifies.
  ProtobufEncoder& varint_field(int field, uint64_t value);
  // double fields (wire type 1).
  ProtobufEncoder& double_field(int field, double value);
  // float fields (wire type 5).
  ProtobufEncoder& float_field(int field, float value);
  // string, bytes and embedded-message fields (wire type 2).
  ProtobufEncoder& bytes_field(int field, std::string_view bytes);

  const std::string& bytes() const { return out_; }

 private:
  void tag(int field, int wire_type);
  void varint(uint64_t value);
  void little_endian(uint64_t value, int n_bytes);

  std::string out_;
};

}  // namespace hybridflow::report
