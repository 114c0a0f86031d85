#include "io/aligned_buffer.h"

#include <cstdlib>
#include <new>
#include <utility>

namespace ckpt::io {

// Shared between a pool and the buffers it handed out, so a buffer that
// outlives its pool frees itself instead of touching a destroyed pool.
struct AlignedBuffer::PoolLink {
  absl::Mutex mu;
  bool alive ABSL_GUARDED_BY(mu) = true;
  size_t max_cached = 0;
  std::vector<uint8_t*> idle ABSL_GUARDED_BY(mu);
};

namespace {
uint8_t* AllocateAligned(size_t capacity) {
  void* p = std::aligned_alloc(kDirectIoAlignment, capacity);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}
}  // namespace

AlignedBuffer::AlignedBuffer(size_t capacity)
    : capacity_(AlignUp(capacity == 0 ? 1 : capacity)), size_(capacity) {
  data_ = AllocateAligned(capacity_);
}

AlignedBuffer::~AlignedBuffer() { Release(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      capacity_(std::exchange(other.capacity_, 0)),
      size_(std::exchange(other.size_, 0)),
      pool_(std::move(other.pool_)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
    size_ = std::exchange(other.size_, 0);
    pool_ = std::move(other.pool_);
  }
  return *this;
}

void AlignedBuffer::set_size(size_t size) {
  size_ = size <= capacity_ ? size : capacity_;
}

void AlignedBuffer::Release() {
  if (data_ == nullptr) return;
  if (pool_ != nullptr) {
    absl::MutexLock lock(&pool_->mu);
    if (pool_->alive && pool_->idle.size() < pool_->max_cached) {
      pool_->idle.push_back(data_);
      data_ = nullptr;
    }
  }
  if (data_ != nullptr) std::free(data_);
  data_ = nullptr;
  pool_.reset();
}

BufferPool::BufferPool(size_t buffer_capacity, size_t max_cached)
    : capacity_(AlignUp(buffer_capacity)),
      link_(std::make_shared<AlignedBuffer::PoolLink>()) {
  link_->max_cached = max_cached;
}

BufferPool::~BufferPool() {
  absl::MutexLock lock(&link_->mu);
  link_->alive = false;
  for (uint8_t* p : link_->idle) std::free(p);
  link_->idle.clear();
}

AlignedBuffer BufferPool::Acquire() {
  AlignedBuffer buffer;
  {
    absl::MutexLock lock(&link_->mu);
    if (!link_->idle.empty()) {
      buffer.data_ = link_->idle.back();
      link_->idle.pop_back();
    }
  }
  if (buffer.data_ == nullptr) buffer.data_ = AllocateAligned(capacity_);
  buffer.capacity_ = capacity_;
  buffer.size_ = capacity_;
  buffer.pool_ = link_;
  return buffer;
}

}  // namespace ckpt::io
