// What a pool counts: the bytes that crossed the controller's socket, those that went worker to worker
// instead, and the objects its workers keep (as of their last heartbeats).
#include "pool_impl.h"

namespace hybridflow {

ProcessPool::HeldObjects ProcessPool::held_objects() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  HeldObjects out;
  for (const auto& r : impl_->ranks) {
    out.objects += r.objects;
    out.bytes += r.object_bytes;
    out.rejected_requests += r.data_rejected;
  }
  return out;
}

Traffic ProcessPool::traffic() const {
  Traffic t;
  t.controller_sent_bytes = impl_->sent_tensor_bytes.load();
  t.controller_received_bytes = impl_->received_tensor_bytes.load();
  t.controller_message_bytes = impl_->message_bytes.load();
  t.controller_messages = impl_->messages.load();
  t.worker_to_worker_bytes = impl_->worker_bytes.load();
  return t;
}

Traffic& Traffic::operator+=(const Traffic& o) {
  controller_sent_bytes += o.controller_sent_bytes;
  controller_received_bytes += o.controller_received_bytes;
  controller_message_bytes += o.controller_message_bytes;
  controller_messages += o.controller_messages;
  worker_to_worker_bytes += o.worker_to_worker_bytes;
  return *this;
}

Traffic Traffic::operator-(const Traffic& o) const {
  Traffic t = *this;
  t.controller_sent_bytes -= o.controller_sent_bytes;
  t.controller_received_bytes -= o.controller_received_bytes;
  t.controller_message_bytes -= o.controller_message_bytes;
  t.controller_messages -= o.controller_messages;
  t.worker_to_worker_bytes -= o.worker_to_worker_bytes;
  return t;
}

}  // namespace hybridflow
