#include "hybridflow/placement/plan.h"

#include <algorithm>

namespace hybridflow::placement {

int Plan::set_of(Role r) const {
  for (size_t i = 0; i < sets.size(); ++i)
    if (std::find(sets[i].roles.begin(), sets[i].roles.end(), r) != sets[i].roles.end()) return static_cast<int>(i);
  return -1;
}

int Plan::devices() const {
  int n = 0;
  for (const auto& s : sets) n += s.devices;
  return n;
}

std::string Plan::placement_name() const {
  if (sets.size() == 1) return "colocate";
  return set_of(Role::kRollout) != set_of(Role::kActor) ? "standalone" : "split";
}

std::string Plan::describe() const {
  std::string out;
  for (const auto& s : sets) {
    if (!out.empty()) out += " ";
    out += "{";
    for (size_t i = 0; i < s.roles.size(); ++i) out += (i ? "," : "") + role_name(s.roles[i]);
    out += "}x" + std::to_string(s.devices);
  }
  return out;
}

std::string layout_text(Role r, const Layout& l) {
  const std::string g = r == Role::kRollout ? "_g" : "";
  return "p" + g + std::to_string(l.pp) + " t" + g + std::to_string(l.tp) + " d" + g + std::to_string(l.dp) +
         (l.sp > 1 ? " s" + std::to_string(l.sp) : "");
}

}  // namespace hybridflow::placement
