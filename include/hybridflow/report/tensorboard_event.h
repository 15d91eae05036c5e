// The protocol-buffer bytes of TensorBoard's Event and Summary messages (tensorboard/compat/proto
// event.proto and summary.proto), encoded by hand for the few fields hybridflow writes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hybridflow::report {

// Event{wall_time, file_version}: the first record of every event file.
std::string file_version_event(double wall_time);

// Summary.Value{tag, simple_value}: one scalar.
std::string scalar_summary_value(std::string_view tag, float value);

// Summary.Value{tag, metadata{plugin "text"}, tensor{DT_STRING scalar}}: the text plugin's format.
std::string text_summary_value(std::string_view tag, std::string_view text);

// Event{wall_time, step, summary{value...}}, `values` being concatenated Summary.Value fields from
// summary_field() (a Summary is just its repeated values).
std::string summary_event(double wall_time, int64_t step, std::string_view values);

// A Summary.Value as field 1 of a Summary, ready to concatenate with others.
std::string summary_field(std::string_view value);

}  // namespace hybridflow::report
