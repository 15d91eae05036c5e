// TFRecord framing, the container of TensorBoard event files: each record is
//   uint64 length (little endian) | masked CRC32C of those 8 bytes | data | masked CRC32C of the data.
// The reader is for tests and tools; TensorBoard itself reads what frame_tfrecord writes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace hybridflow::report {

// The bytes of one record holding `data`.
std::string frame_tfrecord(std::string_view data);

// Every record in `bytes` (the contents of a file named `source`, named in errors). Throws
// hybridflow::Error naming the source and the record's byte offset when a length or data CRC does not
// match or a record is cut off.
std::vector<std::string> read_tfrecords(std::string_view bytes, const std::string& source);

}  // namespace hybridflow::report
