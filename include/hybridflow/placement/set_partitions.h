// Placements are set partitions of the roles (HybridFlow Algorithm 1's get_placements): every way to group
// n roles into non-empty colocated sets, Bell(n) of them (5 roles: 52, 7 roles: 877).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace hybridflow::placement {

// Calls `visit` with each partition of {0, ..., n-1} as a vector of blocks (each ascending, blocks ordered
// by their smallest element), in restricted-growth-string order; `visit` returns false to stop.
void for_each_set_partition(int n, const std::function<bool(const std::vector<std::vector<int>>&)>& visit);

// Bell number B(n) by the Bell triangle; exact up to n = 25.
uint64_t bell_number(int n);

}  // namespace hybridflow::placement
