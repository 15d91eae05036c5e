// A metrics record without what legitimately differs between two runs that must otherwise agree bit for
// bit: wall-clock figures (timing/*, throughput, every *_s), the processes' memory (memory/*), the bytes each
// transport path moved (perf/controller_bytes, perf/worker_to_worker_bytes), and any key in `also`.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>

namespace hybridflow::testing {

inline nlohmann::json deterministic_metrics(nlohmann::json record, const std::set<std::string>& also = {}) {
  for (auto it = record.begin(); it != record.end();) {
    const std::string& key = it.key();
    const bool seconds = key.size() > 2 && key.compare(key.size() - 2, 2, "_s") == 0;
    if (key.rfind("timing/", 0) == 0 || key.rfind("perf/throughput", 0) == 0 || key.rfind("memory/", 0) == 0 ||
        key == "perf/controller_bytes" || key == "perf/worker_to_worker_bytes" || seconds || also.count(key))
      it = record.erase(it);
    else
      ++it;
  }
  return record;
}

}  // namespace hybridflow::testing
