// rollout.stream_groups: the prompts a controller has sent to a streaming rollout pool and not yet seen come
// back, as the requests' meta ("stream_pending") and the weight-sync store (kRolloutStreamKeyPrefix) carry
// them. A streaming call runs every pending prompt it is given, returns the first train_batch_size groups to
// end whatever request drew them, and names them in its reply's meta ("stream_returned"); the controller
// then drops them from its list. A prompt stays pending until a reply returns it, so a checkpoint or a
// restarted pool that lost the rollout process's half-drawn samples starts those prompts again.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "hybridflow/core/data_proto.h"

namespace hybridflow {

struct StreamPrompt {
  int64_t step = 0;   // the step whose request drew it
  int64_t index = 0;  // its row in that request
  std::vector<int64_t> ids;
  nlohmann::json seed;                                   // that request's meta "seed"
  nlohmann::json fields = nlohmann::json::object();      // its per-prompt fields (key -> value)

  std::pair<int64_t, int64_t> key() const { return {step, index}; }
};

// The prompts of the generate_sequences request of step `step`, with their fields and the request's seed.
std::vector<StreamPrompt> stream_prompts_of_request(const DataProto& request, int64_t step);

nlohmann::json stream_prompts_json(const std::vector<StreamPrompt>& prompts);
// Parsed and checked; `where` names the source (a request's meta, a checkpoint file) in the errors.
std::vector<StreamPrompt> stream_prompts_from_json(const nlohmann::json& j, const std::string& where);

// The (step, index) pairs a streaming reply returned, in row order (its meta "stream_returned").
std::vector<std::pair<int64_t, int64_t>> stream_returned(const DataProto& reply);

}  // namespace hybridflow
