#include "hybridflow/core/cpu_memory.h"

#include <c10/core/CPUAllocator.h>

#include <atomic>
#include <mutex>
#include <unordered_map>

#include "hybridflow/core/error.h"

namespace hybridflow {
namespace {

// Forwards to the allocator it replaced and counts the bytes of every block it hands out. The block is its
// own context (as the default allocator's), so raw_allocate / raw_deallocate keep working.
class TrackingAllocator final : public c10::Allocator {
 public:
  explicit TrackingAllocator(c10::Allocator* base) : base_(base), base_delete_(base->raw_deleter()) {
    HF_CHECK(base_delete_ != nullptr, "cpu memory tracking: libtorch's CPU allocator has no raw deleter to wrap");
  }

  c10::DataPtr allocate(size_t n) override {
    void* data = base_->raw_allocate(n);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sizes_[data] = n;
    }
    const int64_t now = current_.fetch_add(static_cast<int64_t>(n)) + static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, data, &release, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }

  int64_t current() const { return current_.load(); }
  int64_t peak() const { return peak_.load(); }
  void reset_peak() { peak_.store(current_.load()); }

  static TrackingAllocator* instance;

 private:
  static void release(void* data) {
    TrackingAllocator& self = *instance;
    size_t n = 0;
    {
      std::lock_guard<std::mutex> lock(self.mu_);
      auto it = self.sizes_.find(data);
      if (it != self.sizes_.end()) {
        n = it->second;
        self.sizes_.erase(it);
      }
    }
    self.current_.fetch_sub(static_cast<int64_t>(n));
    self.base_delete_(data);
  }

  c10::Allocator* base_;
  c10::DeleterFnPtr base_delete_;
  std::mutex mu_;
  std::unordered_map<void*, size_t> sizes_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

TrackingAllocator* TrackingAllocator::instance = nullptr;

}  // namespace

void install_cpu_memory_tracking() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Never destroyed: tensors may be freed during static destruction.
    TrackingAllocator::instance = new TrackingAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(TrackingAllocator::instance, /*priority=*/UINT8_MAX);
    HF_CHECK(c10::GetCPUAllocator() == TrackingAllocator::instance,
             "cpu memory tracking: libtorch kept another CPU allocator");
  });
}

int64_t cpu_memory_current_bytes() {
  return TrackingAllocator::instance != nullptr ? TrackingAllocator::instance->current() : 0;
}

int64_t cpu_memory_peak_bytes() { return TrackingAllocator::instance != nullptr ? TrackingAllocator::instance->peak() : 0; }

void reset_cpu_memory_peak() {
  if (TrackingAllocator::instance != nullptr) TrackingAllocator::instance->reset_peak();
}

int64_t peak_cpu_bytes_during(const std::function<void()>& fn) {
  install_cpu_memory_tracking();
  const int64_t start = cpu_memory_current_bytes();
  reset_cpu_memory_peak();
  fn();
  return cpu_memory_peak_bytes() - start;
}

}  // namespace hybridflow
