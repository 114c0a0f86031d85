#include "io/threaded_readable_file.h"

#include <algorithm>

namespace ckpt::io {

ThreadedReadableFile::ThreadedReadableFile(int concurrency)
    : concurrency_(std::max(1, concurrency)) {}

ThreadedReadableFile::~ThreadedReadableFile() { StopReads(); }

void ThreadedReadableFile::StopReads() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
}

absl::Status ThreadedReadableFile::ReadAsync(uint64_t offset,
                                             absl::Span<uint8_t> dst,
                                             ReadCallback done) {
  if (pool_ == nullptr) pool_ = std::make_unique<ThreadPool>(concurrency_);
  {
    absl::MutexLock lock(&mu_);
    ++in_flight_;
  }
  ++pending_;
  pool_->Schedule([this, offset, dst, done = std::move(done)]() mutable {
    absl::Status s = Read(offset, dst);
    absl::MutexLock lock(&mu_);
    completed_.emplace_back(std::move(done), std::move(s));
    --in_flight_;
  });
  RunCompleted(/*wait=*/false);
  return absl::OkStatus();
}

absl::Status ThreadedReadableFile::WaitAny() {
  if (pending_ > 0) RunCompleted(/*wait=*/true);
  return absl::OkStatus();
}

absl::Status ThreadedReadableFile::ReadQueued(uint64_t offset,
                                              absl::Span<uint8_t> dst) {
  return ReadAsync(offset, dst, [this](absl::Status s) {
    if (!s.ok() && queued_.ok()) queued_ = std::move(s);
  });
}

absl::Status ThreadedReadableFile::WaitReads() {
  while (pending_ > 0) RunCompleted(/*wait=*/true);
  return std::exchange(queued_, {});
}

void ThreadedReadableFile::RunCompleted(bool wait) {
  std::vector<std::pair<ReadCallback, absl::Status>> done;
  {
    absl::MutexLock lock(&mu_);
    auto any = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !completed_.empty();
    };
    if (wait) mu_.Await(absl::Condition(&any));
    done.swap(completed_);
  }
  pending_ -= done.size();
  for (auto& [callback, status] : done) callback(std::move(status));
}

}  // namespace ckpt::io
