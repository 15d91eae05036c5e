// Internal to trainer/: rollout.stream_groups' list of the prompts the controller has sent to the streaming
// rollout pool and not yet seen in a reply (workers/stream_prompts.h). Every streaming request carries the
// list and a reply's stream_returned takes prompts off it, so that requests sent again to a restarted pool,
// whose new process holds none of the half-drawn samples, start those prompts again and each is trained once.
#pragma once

#include <string>
#include <vector>

#include "hybridflow/core/data_proto.h"
#include "hybridflow/workers/stream_prompts.h"

namespace hybridflow {

class StreamPending {
 public:
  // The prompts of a request (stream_prompts_of_request). Requests are sent in step order, so the list stays
  // oldest step first (the order a streaming call admits them in).
  void add(std::vector<StreamPrompt> prompts);
  // Takes off the prompts a reply returned (again harmless).
  void note_reply(const DataProto& reply);
  // `request` with the list in its meta "stream_pending".
  DataProto with_list(DataProto request) const;
  size_t size() const { return prompts_.size(); }

 private:
  std::vector<StreamPrompt> prompts_;
};

}  // namespace hybridflow
