#include "stream_pending.h"

#include <set>

namespace hybridflow {

void StreamPending::add(std::vector<StreamPrompt> prompts) {
  for (StreamPrompt& p : prompts) prompts_.push_back(std::move(p));
}

void StreamPending::note_reply(const DataProto& reply) {
  const auto returned = stream_returned(reply);
  if (returned.empty()) return;
  const std::set<std::pair<int64_t, int64_t>> keys(returned.begin(), returned.end());
  std::erase_if(prompts_, [&keys](const StreamPrompt& p) { return keys.count(p.key()) > 0; });
}

DataProto StreamPending::with_list(DataProto request) const {
  request.meta()["stream_pending"] = stream_prompts_json(prompts_);
  return request;
}

}  // namespace hybridflow
