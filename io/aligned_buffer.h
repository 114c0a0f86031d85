// AlignedBuffer: an owned, move-only byte buffer whose address and capacity are
// multiples of kDirectIoAlignment, as O_DIRECT requires. BufferPool recycles
// buffers of one capacity so the hot path does not fault in fresh pages for
// every chunk.
//
// Thread-safety: an AlignedBuffer is owned by one thread at a time. BufferPool
// is thread-safe, and buffers may outlive their pool (they are then freed
// instead of returned).
#ifndef CKPT_IO_ALIGNED_BUFFER_H_
#define CKPT_IO_ALIGNED_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace ckpt::io {

inline constexpr size_t kDirectIoAlignment = 4096;

inline constexpr uint64_t AlignUp(uint64_t n,
                                  uint64_t alignment = kDirectIoAlignment) {
  return (n + alignment - 1) / alignment * alignment;
}
inline constexpr bool IsAligned(uint64_t n,
                                uint64_t alignment = kDirectIoAlignment) {
  return n % alignment == 0;
}

class BufferPool;

class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  // Allocates AlignUp(capacity) bytes; size() starts equal to `capacity`.
  // Contents are undefined.
  explicit AlignedBuffer(size_t capacity);
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& other) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& other) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() { return data_; }
  const uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  // The number of meaningful bytes (what a write sends); at most capacity().
  size_t size() const { return size_; }
  void set_size(size_t size);
  absl::Span<uint8_t> span() { return {data_, size_}; }
  absl::Span<const uint8_t> span() const { return {data_, size_}; }
  bool empty() const { return data_ == nullptr; }

 private:
  friend class BufferPool;
  struct PoolLink;
  void Release();

  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
  size_t size_ = 0;
  std::shared_ptr<PoolLink> pool_;  // set when the buffer came from a pool
};

class BufferPool {
 public:
  // Buffers of `buffer_capacity` bytes; at most `max_cached` idle buffers are
  // kept.
  BufferPool(size_t buffer_capacity, size_t max_cached);
  ~BufferPool();
  BufferPool(const BufferPool&) = delete;
  BufferPool& operator=(const BufferPool&) = delete;

  // A recycled buffer when one is idle, else a fresh allocation. size() ==
  // capacity.
  AlignedBuffer Acquire();
  size_t buffer_capacity() const { return capacity_; }

 private:
  const size_t capacity_;
  std::shared_ptr<AlignedBuffer::PoolLink> link_;
};

}  // namespace ckpt::io

#endif  // CKPT_IO_ALIGNED_BUFFER_H_
