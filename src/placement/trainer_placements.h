// Which groupings of roles the trainer accepts (shared by the search's filter and trainer_support.cpp).
#pragma once

#include <vector>

#include "hybridflow/placement/trainer_support.h"

namespace hybridflow::placement {

// "" when `hybridflow train` with `caps` accepts this grouping of roles into pools, else why not.
std::string grouping_problem(const std::vector<std::vector<Role>>& sets, const TrainerCapabilities& caps);
inline bool placement_allowed(const std::vector<std::vector<Role>>& sets, const TrainerCapabilities& caps) {
  return grouping_problem(sets, caps).empty();
}

}  // namespace hybridflow::placement
