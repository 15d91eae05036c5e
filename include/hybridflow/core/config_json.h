// A Config's values as JSON, for a free-form map whose entries go on as data (apply_chat_template's kwargs):
// each scalar typed as its text reads in YAML (true/false, an integer, a number, else a string; quoted text is
// always a string), lists as arrays, maps as objects in document order.
#pragma once

#include <nlohmann/json.hpp>

#include "hybridflow/core/config.h"

namespace hybridflow {

nlohmann::ordered_json config_to_json(const Config& config);

}  // namespace hybridflow
