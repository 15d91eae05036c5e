#include "text/post_processors.h"

namespace hybridflow::text {

void TemplatePostProcessor::process(Encodings& encodings, bool add_special_tokens) const {
  if (encodings.empty() || encodings.size() > 2) return;
  const std::vector<Item>& items = encodings.size() == 1 ? single_ : pair_;
  std::vector<int32_t> out;
  for (const Item& item : items) {
    if (item.is_sequence) {
      if (static_cast<size_t>(item.sequence) < encodings.size()) {
        const auto& seq = encodings[static_cast<size_t>(item.sequence)];
        out.insert(out.end(), seq.begin(), seq.end());
      }
    } else if (add_special_tokens) {
      out.insert(out.end(), item.special_ids.begin(), item.special_ids.end());
    }
  }
  encodings.assign(1, std::move(out));
}

}  // namespace hybridflow::text
