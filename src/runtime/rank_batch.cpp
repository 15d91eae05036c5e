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
    : call_id_(call_id), ranks_(std::move(ranks)), leader_(std::move(leader)), parts_(ranks_.size()) {}

namespace {

int64_t rank_batch_tensor_bytes(const DataProto& data) {
  int64_t bytes = 0;
  for (const auto& [key, t] : data.tensors()) bytes += t.numel() * static_cast<int64_t>(t.element_size());
  return bytes;
}

}  // namespace

void RankBatch::finish(size_t slot, Message reply, RankMailbox& own) {
  const int rank = ranks_.at(slot);
  Part part;
  part.answered = true;
  // An empty result with no more to say than its call id: the rank goes into "done", no part to build.
  const bool empty_data = reply.data && reply.data->empty() && reply.data->meta().empty();
  part.done = reply.kind == "result" && empty_data && reply.meta.size() == 1 && reply.meta.contains("call_id");
  if (!part.done) {
    part.json = {{"rank", rank}, {"kind", reply.kind}};
    // The merged reply must stay far below the largest message a receiver takes (HF_MAX_MESSAGE_BYTES).
    const size_t limit =
        std::min<size_t>(kMergedResultBytes, transport_detail::max_message_bytes() / (2 * ranks_.size()));
    bool separate = false;
    if (reply.kind == "result" && reply.data && !empty_data) {
      // Tensor bytes first: a big result is not copied only to learn its size.
      separate = rank_batch_tensor_bytes(*reply.data) > static_cast<int64_t>(limit);
      if (!separate) part.carried = reply.data->serialize();  // bit for bit what the controller decodes again
      separate = separate || part.carried.size() > limit;
    }
    if (separate) {
      own.post(std::move(reply));  // whole, on its own connection, as an unbatched call's
      part.json["separate"] = true;
      part.carried.clear();
    } else {
      reply.meta.erase("call_id");  // the merged reply's
      part.json["meta"] = std::move(reply.meta);
      if (reply.data && part.carried.empty()) part.json["data"] = "empty";
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (parts_.at(slot).answered) return;  // a slot answers once
  parts_[slot] = std::move(part);
  if (++answered_ < ranks_.size()) return;
  // The last rank of the batch to finish sends the merged reply through the leading rank.
  Message merged{"results", {{"call_id", call_id_}}, std::nullopt};
  nlohmann::json done = nlohmann::json::array();
  nlohmann::json parts = nlohmann::json::array();
  DataProto carrier;
  for (size_t i = 0; i < ranks_.size(); ++i) {
    Part& p = parts_[i];
    if (p.done) {
      done.push_back(ranks_[i]);
      continue;
    }
    if (!p.carried.empty()) {
      // One row of bytes per carried result: a DataProto's tensors share only their first dimension.
      const std::string key = "rank" + std::to_string(ranks_[i]);
      auto bytes = torch::empty({1, static_cast<int64_t>(p.carried.size())}, torch::kUInt8);
      std::memcpy(bytes.data_ptr(), p.carried.data(), p.carried.size());
      carrier.set_tensor(key, bytes);
      p.json["data"] = key;
    }
    parts.push_back(std::move(p.json));
  }
  if (!done.empty()) merged.meta["done"] = std::move(done);
  merged.meta["parts"] = std::move(parts);
  if (!carrier.empty()) merged.data = std::move(carrier);
  leader_->post(std::move(merged));
}

RankRequest RankRequest::alone(Message message) {
  RankRequest request;
  request.after = message.meta.value("after", int64_t(-1));
  request.data = std::move(message.data);
  message.data.reset();
  request.message = std::make_shared<const Message>(std::move(message));
  return request;
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
  beats_.erase(rank);
}

std::optional<nlohmann::json> RankDirectory::beat(int rank, nlohmann::json figures, Clock::time_point now) {
  // Lately: within four periods, so that ranks beating out of phase with the sender (or late, on a busy
  // machine) are all named; a stuck rank still drops out long before the controller's timeout.
  const auto lately = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(4 * transport_detail::kHeartbeatPeriodS));
  std::lock_guard<std::mutex> lock(mutex_);
  beats_[rank] = {std::move(figures), now};
  int sender = -1;
  for (const auto& [r, b] : beats_)
    if (now - b.at <= lately) {
      sender = r;
      break;
    }
  if (sender != rank) return std::nullopt;
  nlohmann::json others = nlohmann::json::array();
  for (const auto& [r, b] : beats_)
    if (r != rank && now - b.at <= lately) others.push_back(b.figures);
  return others;
}

void RankDirectory::heard_from_controller(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  heard_ = std::max(heard_, now);
}

RankDirectory::Clock::time_point RankDirectory::last_heard_from_controller() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heard_;
}

bool RankDirectory::submit(int rank, RankRequest request) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = ranks_.find(rank);
  if (it == ranks_.end()) return false;
  it->second(std::move(request));
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
  const int64_t call_id = request.meta.value("call_id", int64_t(-1));
  std::optional<DataProto> data = std::move(request.data);
  request.data.reset();
  // One decoded request for all the batch's ranks: it is never written to once shared.
  auto shared = std::make_shared<const Message>(std::move(request));
  auto batch = std::make_shared<RankBatch>(call_id, ranks, leader);
  for (size_t i = 0; i < ranks.size(); ++i) {
    RankRequest each;
    each.message = shared;
    each.after = afters[i];
    each.batch = batch;
    each.slot = i;
    if (data) {
      // Each rank its own tensors, as if it had decoded the request itself: a method that writes to its
      // input must not change another rank's. The last rank takes the decoded ones, once no copy is left to
      // make from them (the ranks before it may already be running).
      if (i + 1 < ranks.size()) {
        each.data = *data;
        for (const auto& [key, t] : data->tensors()) each.data->set_tensor(key, t.clone());
      } else {
        each.data = std::move(data);
      }
    }
    if (!RankDirectory::process().submit(ranks[i], std::move(each))) {
      Message error{"error", {{"call_id", call_id}}, std::nullopt};
      error.meta["message"] = "rank " + std::to_string(ranks[i]) + " is not served by this worker process";
      batch->finish(i, std::move(error), *leader);
    }
  }
}

std::vector<RankRequest> CallOrder::arrive(RankRequest request) {
  std::vector<RankRequest> ready;
  const int64_t after = request.after;
  if (after < 0) {
    ready.push_back(std::move(request));
    return ready;
  }
  if (after != last_) {
    held_.emplace(after, std::move(request));
    return ready;
  }
  last_ = request.message->meta.value("call_id", int64_t(-1));
  ready.push_back(std::move(request));
  for (auto it = held_.find(last_); it != held_.end(); it = held_.find(last_)) {
    last_ = it->second.message->meta.value("call_id", int64_t(-1));
    ready.push_back(std::move(it->second));
    held_.erase(it);
  }
  return ready;
}

}  // namespace hybridflow::runtime_detail
