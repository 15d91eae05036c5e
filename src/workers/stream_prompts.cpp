#include "hybridflow/workers/stream_prompts.h"

#include "hybridflow/core/error.h"
#include "hybridflow/workers/rl_batch.h"

namespace hybridflow {

std::vector<StreamPrompt> stream_prompts_of_request(const DataProto& request, int64_t step) {
  const std::vector<std::vector<int64_t>> ids = prompt_token_lists(request);
  std::vector<StreamPrompt> prompts;
  for (size_t i = 0; i < ids.size(); ++i) {
    StreamPrompt p;
    p.step = step;
    p.index = static_cast<int64_t>(i);
    p.ids = ids[i];
    p.seed = request.meta().at("seed");
    for (const auto& [key, values] : request.fields()) p.fields[key] = values.at(i);
    prompts.push_back(std::move(p));
  }
  return prompts;
}

nlohmann::json stream_prompts_json(const std::vector<StreamPrompt>& prompts) {
  nlohmann::json list = nlohmann::json::array();
  for (const StreamPrompt& p : prompts)
    list.push_back({{"step", p.step}, {"index", p.index}, {"ids", p.ids}, {"seed", p.seed}, {"fields", p.fields}});
  return list;
}

std::vector<StreamPrompt> stream_prompts_from_json(const nlohmann::json& j, const std::string& where) {
  HF_CHECK(j.is_array(), where, ": expected a list of streamed prompts, got ", j.type_name());
  std::vector<StreamPrompt> prompts;
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& e = j[i];
    try {
      StreamPrompt p;
      p.step = e.at("step").get<int64_t>();
      p.index = e.at("index").get<int64_t>();
      p.ids = e.at("ids").get<std::vector<int64_t>>();
      p.seed = e.at("seed");
      p.fields = e.value("fields", nlohmann::json::object());
      HF_CHECK(!p.ids.empty() && p.step >= 0 && p.index >= 0 && p.fields.is_object(), "an empty prompt, a negative step ",
               "or index, or fields that are not an object");
      prompts.push_back(std::move(p));
    } catch (const std::exception& ex) {
      HF_FAIL(where, ": streamed prompt ", i, " is not {step, index, ids, seed, fields}: ", ex.what());
    }
  }
  return prompts;
}

std::vector<std::pair<int64_t, int64_t>> stream_returned(const DataProto& reply) {
  std::vector<std::pair<int64_t, int64_t>> keys;
  if (!reply.meta().contains("stream_returned")) return keys;
  for (const auto& k : reply.meta().at("stream_returned")) keys.emplace_back(k.at(0).get<int64_t>(), k.at(1).get<int64_t>());
  return keys;
}

}  // namespace hybridflow
