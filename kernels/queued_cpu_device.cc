// The CPU twin of the CUDA device's stream: host memory plays device memory,
// and copies, shuffles and chunk hashes are queued on a thread of the device's
// own, in order, completing after the call returns. Events wait for what was
// queued before them. It runs the paths libckpt takes for a GPU (queued copies,
// events, hashes taken on the device) where there is no GPU.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/device.h"
#include "kernels/xxh3.h"
#include "snapshot/filter.h"

namespace ckpt::kernels {
namespace {

// One thread running tasks in the order they were queued.
class Queue {
 public:
  Queue() : worker_([this] { Run(); }) {}
  ~Queue() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    worker_.join();
  }
  // The task's number: done once done() reaches it.
  uint64_t Push(std::function<void()> task) {
    absl::MutexLock lock(&mu_);
    tasks_.push_back(std::move(task));
    return ++queued_;
  }
  void WaitFor(uint64_t n) {
    absl::MutexLock lock(&mu_);
    auto reached = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ >= n;
    };
    mu_.Await(absl::Condition(&reached));
  }
  uint64_t queued() {
    absl::MutexLock lock(&mu_);
    return queued_;
  }

 private:
  void Run() {
    while (true) {
      std::function<void()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stopping_ || !tasks_.empty();
        };
        mu_.Await(absl::Condition(&ready));
        if (tasks_.empty()) return;
        task = std::move(tasks_.front());
        tasks_.pop_front();
      }
      task();
      absl::MutexLock lock(&mu_);
      ++done_;
    }
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  uint64_t queued_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t done_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

class QueuedEvent final : public Event {
 public:
  QueuedEvent(Queue* queue, uint64_t at) : queue_(queue), at_(at) {}
  absl::Status Wait() override {
    queue_->WaitFor(at_);
    return absl::OkStatus();
  }

 private:
  Queue* const queue_;
  const uint64_t at_;
};

class QueuedCpuDevice final : public Device {
 public:
  explicit QueuedCpuDevice(size_t max_allocation)
      : max_allocation_(max_allocation) {}
  std::string name() const override { return "cpu-queued"; }
  absl::Status CopyToHost(const void* src, void* dst, size_t n) override {
    queue_.Push([=] { std::memcpy(dst, src, n); });
    return absl::OkStatus();
  }
  absl::Status CopyFromHost(const void* src, void* dst, size_t n) override {
    queue_.Push([=] { std::memcpy(dst, src, n); });
    return absl::OkStatus();
  }
  absl::Status ByteShuffle(const void* src, void* dst, size_t n,
                           size_t width) override {
    queue_.Push([=] {
      snapshot::ByteShuffle(static_cast<const uint8_t*>(src),
                            static_cast<uint8_t*>(dst), n, width);
    });
    return absl::OkStatus();
  }
  // With the GPU kernel's own arithmetic (kernels/xxh3.h), not libxxhash.
  absl::Status HashChunks(const void* src, size_t n, size_t chunk,
                          uint64_t* hashes) override {
    if (chunk == 0) return absl::InvalidArgumentError("HashChunks: chunk 0");
    queue_.Push([=] {
      static constexpr uint8_t kSecret[xxh3::kSecretSize] = CKPT_XXH3_SECRET;
      const auto* p = static_cast<const uint8_t*>(src);
      for (size_t at = 0, i = 0; at < n; at += chunk, ++i) {
        const size_t len = std::min(chunk, n - at);
        hashes[i] = len <= xxh3::kMidSizeMax
                        ? xxh3::HashShort(p + at, len, kSecret)
                        : xxh3::HashLongAsWarp(p + at, len, kSecret);
      }
    });
    return absl::OkStatus();
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareGather(
      absl::Span<const GatherPiece> pieces) override {
    return NewHostGather(pieces);
  }
  absl::Status Gather(const Batch& gather, void* dst) override {
    absl::Status s = CheckBatch(gather, Batch::Kind::kGather);
    if (s.ok()) queue_.Push([&gather, dst] { RunGatherOnHost(gather, dst); });
    return s;
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareHashes(
      absl::Span<const HashRun> runs, size_t chunk) override {
    return NewHostHashes(runs, chunk);
  }
  absl::Status HashBatch(const Batch& batch, uint64_t* hashes) override {
    absl::Status s = CheckBatch(batch, Batch::Kind::kHashes);
    if (s.ok()) {
      queue_.Push([&batch, hashes] { RunHashesOnHost(batch, hashes); });
    }
    return s;
  }
  absl::Status Synchronize() override {
    queue_.WaitFor(queue_.queued());
    return absl::OkStatus();
  }
  bool host_resident() const override { return false; }
  bool queues_copies() const override { return true; }
  absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(
      void*, size_t) override {
    return std::make_unique<HostRegistration>();
  }
  absl::StatusOr<std::unique_ptr<Event>> RecordEvent() override {
    return std::unique_ptr<Event>(new QueuedEvent(&queue_, queue_.queued()));
  }
  // No other streams: the trainer's "compute" is its host thread, which
  // already ran before these calls.
  absl::Status WaitForStream(void*) override { return absl::OkStatus(); }
  absl::Status StreamWaitEvent(void*, Event&) override {
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Allocate(size_t n) override {
    if (n > max_allocation_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("cpu-queued: out of device memory for ", n,
                       " bytes (at most ", max_allocation_, " at a time)"));
    }
    void* p = std::malloc(n == 0 ? 1 : n);
    if (p == nullptr) return absl::ResourceExhaustedError("malloc");
    return p;
  }
  void Free(void* p) override {
    Synchronize().IgnoreError();  // queued work may still use it
    std::free(p);
  }

 private:
  const size_t max_allocation_;
  Queue queue_;
};

}  // namespace

std::unique_ptr<Device> NewQueuedCpuDevice() {
  return NewQueuedCpuDevice(std::numeric_limits<size_t>::max());
}

std::unique_ptr<Device> NewQueuedCpuDevice(size_t max_allocation) {
  return std::make_unique<QueuedCpuDevice>(max_allocation);
}

}  // namespace ckpt::kernels
