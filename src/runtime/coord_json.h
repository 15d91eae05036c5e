// A rank's mesh coordinate as it travels to its worker process (the pool passes it on unread).
#pragma once

#include <nlohmann/json.hpp>

#include "hybridflow/runtime/mesh_coord.h"

namespace hybridflow::runtime_detail {
nlohmann::json coord_to_json(const MeshCoord& c);
MeshCoord coord_from_json(const nlohmann::json& j);
}  // namespace hybridflow::runtime_detail
