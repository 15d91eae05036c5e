#include "hybridflow/report/tensorboard_event.h"

#include "hybridflow/report/protobuf_encoder.h"

namespace hybridflow::report {
namespace {

// Field numbers from TensorBoard's protos.
namespace event {
constexpr int kWallTime = 1, kStep = 2, kFileVersion = 3, kSummary = 5;
}
namespace summary {
constexpr int kValue = 1;
}
namespace summary_value {
constexpr int kTag = 1, kSimpleValue = 2, kTensor = 8, kMetadata = 9;
}
namespace summary_metadata {
constexpr int kPluginData = 1;
}
namespace plugin_data {
constexpr int kPluginName = 1;
}
namespace tensor {
constexpr int kDtype = 1, kShape = 2, kStringVal = 8;
constexpr uint64_t kDtString = 7;  // DataType.DT_STRING
}

// The version string TensorBoard looks for in the first record.
constexpr std::string_view kFileVersion = "brain.Event:2";

}  // namespace

std::string file_version_event(double wall_time) {
  ProtobufEncoder e;
  e.double_field(event::kWallTime, wall_time).bytes_field(event::kFileVersion, kFileVersion);
  return e.bytes();
}

std::string scalar_summary_value(std::string_view tag, float value) {
  ProtobufEncoder e;
  e.bytes_field(summary_value::kTag, tag).float_field(summary_value::kSimpleValue, value);
  return e.bytes();
}

std::string text_summary_value(std::string_view tag, std::string_view text) {
  // The text plugin finds its data by plugin name; its content (TextPluginData, version 0) is empty.
  ProtobufEncoder plugin;
  plugin.bytes_field(plugin_data::kPluginName, "text");
  ProtobufEncoder metadata;
  metadata.bytes_field(summary_metadata::kPluginData, plugin.bytes());
  // A rank-0 string tensor: an empty TensorShapeProto, one string_val.
  ProtobufEncoder t;
  t.varint_field(tensor::kDtype, tensor::kDtString).bytes_field(tensor::kShape, "").bytes_field(tensor::kStringVal, text);
  ProtobufEncoder e;
  e.bytes_field(summary_value::kTag, tag)
      .bytes_field(summary_value::kTensor, t.bytes())
      .bytes_field(summary_value::kMetadata, metadata.bytes());
  return e.bytes();
}

std::string summary_field(std::string_view value) {
  ProtobufEncoder e;
  e.bytes_field(summary::kValue, value);
  return e.bytes();
}

std::string summary_event(double wall_time, int64_t step, std::string_view values) {
  ProtobufEncoder e;
  e.double_field(event::kWallTime, wall_time)
      .varint_field(event::kStep, static_cast<uint64_t>(step))
      .bytes_field(event::kSummary, values);
  return e.bytes();
}

}  // namespace hybridflow::report
