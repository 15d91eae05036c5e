#include "rank_batch.h"

#include <torch/torch.h>

#include <algorithm>
#include <cstring>

#include "hybridflow/core/error.h"

namespace hybridflow::runtime_detail {

using transport_detail::Message;

void RankMailbox::post(Message message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    out_.push_back(std::move(message));
  }
  wake_.notify();
}

std::vector<Message> RankMailbox::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::exchange(out_, {});
}

RankBatch::RankBatch(int64_t call_id, std::vector<int> ranks, std::shared_ptr<RankMailbox> leader)
    : call_id_(call_id), ranks_(std::move(ranks)), leader_(std::move(leader)) {}

namespace {

int64_t rank_batch_tensor_bytes(const DataProto& data) {
  int64_t bytes = 0;
  for (const auto& [key, t] : data.tensors()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace

void RankBatch::finish(int rank, Message reply, RankMailbox& own) {
  nlohmann::json part = {{"rank", rank}, {"kind", reply.kind}};
  std::string carried;
  // The merged reply must stay far below the largest message a receiver takes (HF_MAX_MESSAGE_BYTES).
  const size_t limit = std::min<size_t>(kMergedResultBytes, transport_detail::max_message_bytes() / (2 * ranks_.size()));
  bool separate = false;
  if (reply.kind == "result" && reply.data && !(reply.data->empty() && reply.data->meta().empty())) {
    // Tensor bytes first: a big result is not copied only to learn its size.
    separate = rank_batch_tensor_bytes(*reply.data) > static_cast<int64_t>(limit);
    if (!separate) carried = reply.data->serialize();  // bit for bit what the controller decodes again
    separate = separate || carried.size() > limit;
  }
  if (separate) {
    own.post(std::move(reply));  // whole, on its own connection, as an unbatched call's
    part["separate"] = true;
    carried.clear();
  } else {
    reply.meta.erase("call_id");  // the merged reply's
    part["meta"] = std::move(reply.meta);
    if (reply.data && carried.empty()) part["data"] = "empty";
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!carried.empty()) carried_[rank] = std::move(carried);
  parts_[rank] = std::move(part);
  if (parts_.size() < ranks_.size()) return;
  // The last rank of the batch to finish sends the merged reply through the leading rank.
  Message merged{"results", {{"call_id", call_id_}}, std::nullopt};
  nlohmann::json parts = nlohmann::json::array();
  DataProto carrier;
  for (int r : ranks_) {
    nlohmann::json& p = parts_.at(r);
    if (auto it = carried_.find(r); it != carried_.end()) {
      // One row of bytes per carried result: a DataProto's tensors share only their first dimension.
      const std::string key = "rank" + std::to_string(r);
      auto bytes = torch::empty({1, static_cast<int64_t>(it->second.size())}, torch::kUInt8);
      std::memcpy(bytes.data_ptr(), it->second.data(), it->second.size());
      carrier.set_tensor(key, bytes);
      p["data"] = key;
    }
    parts.push_back(std::move(p));
  }
  merged.meta["parts"] = std::move(parts);
  if (!carrier.empty()) merged.data = std::move(carrier);
  leader_->post(std::move(merged));
}

RankDirectory& RankDirectory::process() {
  static RankDirectory* directory = new RankDirectory();  // never destroyed: rank threads may outlive statics
  return *directory;
}

void RankDirectory::add(int rank, Submit submit) {
  std::lock_guard<std::mutex> lock(mutex_);
  ranks_[rank] = std::move(submit);
}

void RankDirectory::remove(int rank) {
  std::lock_guard<std::mutex> lock(mutex_);
  ranks_.erase(rank);
}

bool RankDirectory::submit(int rank, Message request, std::shared_ptr<RankBatch> batch) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return false;
  it->second(std::move(request), std::move(batch));
  return true;
}

void dispatch_rank_batch(Message request, const std::shared_ptr<RankMailbox>& leader) {
  const nlohmann::json list = std::move(request.meta.at("ranks"));
  request.meta.erase("ranks");
  std::vector<int> ranks;
  std::vector<int64_t> afters;
  for (const auto& entry : list) {
    ranks.push_back(entry.at(0).get<int>());
    afters.push_back(entry.at(1).get<int64_t>());
  }
  auto batch = std::make_shared<RankBatch>(request.meta.value("call_id", int64_t(-1)), ranks, leader);
  for (size_t i = 0; i < ranks.size(); ++i) {
    Message copy{request.kind, request.meta, std::nullopt};
    copy.meta["after"] = afters[i];
    if (request.data) {
      // Each rank its own tensors, as if it had decoded the request itself: a method that writes to its
      // input must not change another rank's. The last rank takes the decoded ones, once no copy is left to
      // make from them (the ranks before it may already be running).
      copy.data = *request.data;
      if (i + 1 < ranks.size())
        for (const auto& [key, t] : request.data->tensors()) copy.data->set_tensor(key, t.clone());
    }
    if (!RankDirectory::process().submit(ranks[i], std::move(copy), batch)) {
      Message error{"error", {{"call_id", request.meta.value("call_id", int64_t(-1))}}, std::nullopt};
      error.meta["message"] = "rank " + std::to_string(ranks[i]) + " is not served by this worker process";
      batch->finish(ranks[i], std::move(error), *leader);
    }
  }
}

std::vector<RankRequest> CallOrder::arrive(RankRequest request) {
  std::vector<RankRequest> ready;
  const int64_t after = request.message.meta.value("after", int64_t(-1));
  if (after < 0) {
    ready.push_back(std::move(request));
    return ready;
  }
  if (after != last_) {
    held_.emplace(after, std::move(request));
    return ready;
  }
  last_ = request.message.meta.value("call_id", int64_t(-1));
  ready.push_back(std::move(request));
  for (auto it = held_.find(last_); it != held_.end(); it = held_.find(last_)) {
    last_ = it->second.message.meta.value("call_id", int64_t(-1));
    ready.push_back(std::move(it->second));
    held_.erase(it);
  }
  return ready;
}

}  // namespace hybridflow::runtime_detail
