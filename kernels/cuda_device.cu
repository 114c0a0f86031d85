// The CUDA device: copies on its own stream, and byte-shuffle and chunk-hash
// kernels that match the CPU reference bit for bit. cudaError_t is converted
// to absl::Status only in CudaStatus().
#include <cuda_runtime.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
#include "kernels/gather.h"
#include "kernels/shuffle.h"
#include "kernels/xxh3.h"

namespace ckpt::kernels {
namespace {

absl::Status CudaStatus(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("CUDA ", what, ": ",
                                          cudaGetErrorName(err), ": ",
                                          cudaGetErrorString(err)));
}

// dst[b * elements + i] = src[i * width + b]; the tail (n % width bytes) is
// copied unchanged. Any width and alignment, a byte per thread.
__global__ void ByteShuffleKernel(const uint8_t* src, uint8_t* dst, size_t n,
                                  size_t width) {
  const size_t elements = n / width;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  for (size_t k = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       k < n; k += stride) {
    if (k < elements * width) {
      size_t i = k / width, b = k % width;
      dst[b * elements + i] = src[k];
    } else {
      dst[k] = src[k];
    }
  }
}

// The same for W-byte elements from a 16-byte aligned `src`, four elements
// per thread (kernels/shuffle.h; ShuffleAsGrid is this loop on the host).
template <int W>
__global__ void ByteShuffleGroupsKernel(const uint8_t* src, uint8_t* dst,
                                        size_t n) {
  const size_t elements = n / W;
  const size_t groups = elements / 4;
  const size_t stride = static_cast<size_t>(blockDim.x) * gridDim.x;
  const size_t first =
      static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool words = shuffle::WordStores(dst, elements);
  for (size_t g = first; g < groups; g += stride) {
    shuffle::Group<W>(src, dst, elements, g, words);
  }
  for (size_t k = groups * 4 * W + first; k < n; k += stride) {
    shuffle::TailByte<W>(src, dst, elements, k);
  }
}

__constant__ uint8_t kDeviceSecret[xxh3::kSecretSize] = CKPT_XXH3_SECRET;

// Warp thread `t` of the warp hashing [in, in + len): every thread takes its
// part, and thread 0 writes XXH3-64 to *out. Each thread sums one accumulator
// lane of four stripes of a 1 KiB block, the warp adds the sums up by
// shuffles, and every thread keeps its lane's accumulator (kernels/xxh3.h;
// HashLongAsWarp is this loop on the host).
__device__ void HashAsWarp(const uint8_t* in, size_t len, int t,
                           uint64_t* out) {
  namespace x = xxh3;
  constexpr unsigned kAll = 0xffffffffu;
  const uint8_t* secret = kDeviceSecret;
  if (len <= x::kMidSizeMax) {
    if (t == 0) *out = x::HashShort(in, len, secret);
    return;
  }
  const int lane = t % 8;
  uint64_t acc = x::InitialLane(lane);
  auto accumulate = [&](const uint8_t* at, const uint8_t* key, int stripes) {
    uint64_t p, v;
    x::ThreadTerms(at, key, t, stripes, &p, &v);
    p += __shfl_xor_sync(kAll, p, 8);
    p += __shfl_xor_sync(kAll, p, 16);
    v += __shfl_xor_sync(kAll, v, 8);
    v += __shfl_xor_sync(kAll, v, 16);
    acc += p + __shfl_xor_sync(kAll, v, 1);
  };
  const size_t blocks = x::WholeBlocks(len);
  for (size_t b = 0; b < blocks; ++b) {
    accumulate(in + b * x::kBlock, secret, x::kStripesPerBlock);
    acc = x::ScrambleLane(acc, secret, lane);
  }
  accumulate(in + blocks * x::kBlock, secret, x::LastStripes(len));
  accumulate(in + len - x::kStripe, secret + x::kLastStripeSecret, 1);
  uint64_t all[8];
  for (int l = 0; l < 8; ++l) all[l] = __shfl_sync(kAll, acc, l);
  if (t == 0) *out = x::MergeAccs(all, secret, len);
}

// The warp of the calling thread, among `warps` of the grid.
__device__ size_t WarpIndex() {
  return (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
         xxh3::kWarp;
}

// XXH3-64 of every `chunk`-byte piece of [src, src + n) into out[], one warp
// per piece (grid-strided).
__global__ void HashChunksKernel(const uint8_t* src, size_t n, size_t chunk,
                                 uint64_t* out) {
  const int t = static_cast<int>(threadIdx.x % xxh3::kWarp);
  const size_t warps =
      static_cast<size_t>(gridDim.x) * blockDim.x / xxh3::kWarp;
  const size_t chunks = (n + chunk - 1) / chunk;
  for (size_t c = WarpIndex(); c < chunks; c += warps) {
    const size_t len = chunk < n - c * chunk ? chunk : n - c * chunk;
    HashAsWarp(src + c * chunk, len, t, &out[c]);
  }
}

// XXH3-64 of every entry of a batch's table into out[entry.at], one warp per
// entry (grid-strided).
__global__ void HashTableKernel(const TableEntry* table, size_t count,
                                uint64_t* out) {
  const int t = static_cast<int>(threadIdx.x % xxh3::kWarp);
  const size_t warps =
      static_cast<size_t>(gridDim.x) * blockDim.x / xxh3::kWarp;
  for (size_t e = WarpIndex(); e < count; e += warps) {
    const TableEntry entry = table[e];
    HashAsWarp(entry.src, entry.n, t, &out[entry.at]);
  }
}

// Copies every entry of a gather's table to dst + entry.at, one block per
// entry (grid-strided; kernels/gather.h, GatherAsGrid on the host).
__global__ void GatherKernel(const TableEntry* table, size_t count,
                             uint8_t* dst) {
  for (size_t e = blockIdx.x; e < count; e += gridDim.x) {
    gather::EntryPart(table[e], dst, threadIdx.x, blockDim.x);
  }
}

// A batch whose table (and, for hashes, output) lives in device memory.
class CudaBatch final : public Batch {
 public:
  CudaBatch(Kind kind, std::vector<TableEntry> entries)
      : Batch(kind, std::move(entries)) {}
  ~CudaBatch() override {
    // cudaFree waits for the device: no queued launch still reads these.
    if (table_ != nullptr) cudaFree(table_);
    if (out_ != nullptr) cudaFree(out_);
  }
  absl::Status Upload() {
    const size_t bytes = entries().size() * sizeof(TableEntry);
    if (bytes == 0) return absl::OkStatus();
    absl::Status s = CudaStatus(cudaMalloc(&table_, bytes),
                                "cudaMalloc for a batch's table");
    if (s.ok()) {
      s = CudaStatus(
          cudaMemcpy(table_, entries().data(), bytes, cudaMemcpyHostToDevice),
          "cudaMemcpy of a batch's table");
    }
    if (s.ok() && kind() == Kind::kHashes) {
      s = CudaStatus(cudaMalloc(&out_, outputs() * sizeof(uint64_t)),
                     "cudaMalloc for a batch's hashes");
    }
    return s;
  }
  const TableEntry* table() const { return table_; }
  uint64_t* out() const { return out_; }

 private:
  TableEntry* table_ = nullptr;
  uint64_t* out_ = nullptr;
};

// Blocks for `units` units of work, `per_block` to a block (at least one;
// the kernels stride over the grid beyond 65536 blocks).
unsigned GridFor(size_t units, size_t per_block) {
  return static_cast<unsigned>(std::clamp<size_t>(
      (units + per_block - 1) / per_block, 1, size_t{1} << 16));
}

// Page-locks host memory (a mapped staging slot) until destroyed.
class CudaHostRegistration final : public HostRegistration {
 public:
  explicit CudaHostRegistration(void* p) : p_(p) {}
  ~CudaHostRegistration() override { cudaHostUnregister(p_); }

 private:
  void* const p_;
};

class CudaEvent final : public Event {
 public:
  CudaEvent(int ordinal, cudaEvent_t event)
      : ordinal_(ordinal), event_(event) {}
  ~CudaEvent() override { cudaEventDestroy(event_); }
  absl::Status Wait() override {
    // The waiting thread is usually not the one that made the device current.
    absl::Status s = CudaStatus(cudaSetDevice(ordinal_), "cudaSetDevice");
    if (!s.ok()) return s;
    return CudaStatus(cudaEventSynchronize(event_), "cudaEventSynchronize");
  }
  cudaEvent_t get() const { return event_; }

 private:
  const int ordinal_;
  const cudaEvent_t event_;
};

// A blocking-sync event: its waiter sleeps instead of spinning a core that the
// trainer's data loader may need.
absl::StatusOr<cudaEvent_t> NewEvent() {
  cudaEvent_t event;
  absl::Status s =
      CudaStatus(cudaEventCreateWithFlags(
                     &event, cudaEventBlockingSync | cudaEventDisableTiming),
                 "cudaEventCreate");
  if (!s.ok()) return s;
  return event;
}

class CudaDevice final : public Device {
 public:
  CudaDevice(int ordinal, cudaStream_t stream, cudaEvent_t fence)
      : ordinal_(ordinal), stream_(stream), fence_(fence) {}
  ~CudaDevice() override {
    cudaEventDestroy(fence_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return absl::StrCat("cuda:", ordinal_); }

  absl::Status CopyToHost(const void* src, void* dst, size_t n) override {
    return CudaStatus(
        cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpyAsync to host");
  }
  absl::Status CopyFromHost(const void* src, void* dst, size_t n) override {
    return CudaStatus(
        cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync from host");
  }
  absl::Status ByteShuffle(const void* src, void* dst, size_t n,
                           size_t width) override {
    if (n == 0) return absl::OkStatus();
    if (width <= 1) {
      return CudaStatus(
          cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, stream_),
          "cudaMemcpyAsync device to device");
    }
    const auto* in = static_cast<const uint8_t*>(src);
    auto* out = static_cast<uint8_t*>(dst);
    const bool vectors = (reinterpret_cast<uintptr_t>(in) & 15) == 0;
    if (vectors && width == 2) {
      ByteShuffleGroupsKernel<2>
          <<<GridFor(n / 8, 256), 256, 0, stream_>>>(in, out, n);
    } else if (vectors && width == 4) {
      ByteShuffleGroupsKernel<4>
          <<<GridFor(n / 16, 256), 256, 0, stream_>>>(in, out, n);
    } else if (vectors && width == 8) {
      ByteShuffleGroupsKernel<8>
          <<<GridFor(n / 32, 256), 256, 0, stream_>>>(in, out, n);
    } else {
      ByteShuffleKernel<<<GridFor(n, 256), 256, 0, stream_>>>(in, out, n,
                                                              width);
    }
    return CudaStatus(cudaGetLastError(), "byte-shuffle kernel launch");
  }
  absl::Status HashChunks(const void* src, size_t n, size_t chunk,
                          uint64_t* hashes) override {
    if (chunk == 0) return absl::InvalidArgumentError("HashChunks: chunk 0");
    if (n == 0) return absl::OkStatus();
    const size_t chunks = (n + chunk - 1) / chunk;
    void* out = nullptr;
    absl::Status s =
        CudaStatus(cudaMallocAsync(&out, chunks * sizeof(uint64_t), stream_),
                   "cudaMallocAsync for chunk hashes");
    if (!s.ok()) return s;
    HashChunksKernel<<<GridFor(chunks, 8), 256, 0, stream_>>>(
        static_cast<const uint8_t*>(src), n, chunk,
        static_cast<uint64_t*>(out));
    s = CudaStatus(cudaGetLastError(), "chunk-hash kernel launch");
    if (s.ok()) {
      s = CudaStatus(cudaMemcpyAsync(hashes, out, chunks * sizeof(uint64_t),
                                     cudaMemcpyDeviceToHost, stream_),
                     "cudaMemcpyAsync of chunk hashes");
    }
    absl::Status freed =
        CudaStatus(cudaFreeAsync(out, stream_), "cudaFreeAsync");
    return s.ok() ? freed : s;
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareGather(
      absl::Span<const GatherPiece> pieces) override {
    absl::StatusOr<std::vector<TableEntry>> table = GatherTable(pieces);
    if (!table.ok()) return table.status();
    return Upload(Batch::Kind::kGather, *std::move(table));
  }
  absl::Status Gather(const Batch& gather, void* dst) override {
    absl::StatusOr<const CudaBatch*> batch = Ours(gather, Batch::Kind::kGather);
    if (!batch.ok()) return batch.status();
    const size_t count = (*batch)->entries().size();
    if (count == 0) return absl::OkStatus();
    GatherKernel<<<GridFor(count, 1), 256, 0, stream_>>>(
        (*batch)->table(), count, static_cast<uint8_t*>(dst));
    return CudaStatus(cudaGetLastError(), "gather kernel launch");
  }
  absl::StatusOr<std::unique_ptr<Batch>> PrepareHashes(
      absl::Span<const HashRun> runs, size_t chunk) override {
    absl::StatusOr<std::vector<TableEntry>> table = HashTable(runs, chunk);
    if (!table.ok()) return table.status();
    return Upload(Batch::Kind::kHashes, *std::move(table));
  }
  absl::Status HashBatch(const Batch& hashes_batch, uint64_t* hashes) override {
    absl::StatusOr<const CudaBatch*> batch =
        Ours(hashes_batch, Batch::Kind::kHashes);
    if (!batch.ok()) return batch.status();
    const size_t count = (*batch)->entries().size();
    if (count == 0) return absl::OkStatus();
    HashTableKernel<<<GridFor(count, 8), 256, 0, stream_>>>(
        (*batch)->table(), count, (*batch)->out());
    absl::Status s = CudaStatus(cudaGetLastError(), "batch hash kernel launch");
    if (!s.ok()) return s;
    return CudaStatus(cudaMemcpyAsync(hashes, (*batch)->out(),
                                      (*batch)->outputs() * sizeof(uint64_t),
                                      cudaMemcpyDeviceToHost, stream_),
                      "cudaMemcpyAsync of a batch's hashes");
  }
  absl::Status Synchronize() override {
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
  bool host_resident() const override { return false; }
  bool queues_copies() const override { return true; }
  absl::StatusOr<std::unique_ptr<HostRegistration>> RegisterHost(
      void* p, size_t n) override {
    if (n == 0) return std::make_unique<HostRegistration>();
    absl::Status s = CudaStatus(
        cudaHostRegister(p, n, cudaHostRegisterPortable), "cudaHostRegister");
    if (!s.ok()) return s;
    return std::unique_ptr<HostRegistration>(new CudaHostRegistration(p));
  }
  absl::StatusOr<std::unique_ptr<Event>> RecordEvent() override {
    absl::StatusOr<cudaEvent_t> event = NewEvent();
    if (!event.ok()) return event.status();
    absl::Status s =
        CudaStatus(cudaEventRecord(*event, stream_), "cudaEventRecord");
    if (!s.ok()) {
      cudaEventDestroy(*event);
      return s;
    }
    return std::unique_ptr<Event>(new CudaEvent(ordinal_, *event));
  }
  absl::Status WaitForStream(void* stream) override {
    absl::Status s =
        CudaStatus(cudaEventRecord(fence_, static_cast<cudaStream_t>(stream)),
                   "cudaEventRecord on the compute stream");
    if (!s.ok()) return s;
    return CudaStatus(cudaStreamWaitEvent(stream_, fence_, 0),
                      "cudaStreamWaitEvent (copy after compute)");
  }
  absl::Status StreamWaitEvent(void* stream, Event& event) override {
    auto* cuda = dynamic_cast<CudaEvent*>(&event);
    if (cuda == nullptr) {
      return absl::InvalidArgumentError(
          "StreamWaitEvent: the event is not from a CUDA device");
    }
    return CudaStatus(
        cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), cuda->get(), 0),
        "cudaStreamWaitEvent (compute after copy)");
  }
  absl::StatusOr<void*> Allocate(size_t n) override {
    void* p = nullptr;
    absl::Status s = CudaStatus(cudaMalloc(&p, n == 0 ? 1 : n), "cudaMalloc");
    if (!s.ok()) return s;
    return p;
  }
  void Free(void* p) override { cudaFree(p); }

 private:
  absl::StatusOr<std::unique_ptr<Batch>> Upload(Batch::Kind kind,
                                                std::vector<TableEntry> table) {
    auto batch = std::make_unique<CudaBatch>(kind, std::move(table));
    absl::Status s = batch->Upload();
    if (!s.ok()) return s;
    return std::unique_ptr<Batch>(std::move(batch));
  }
  static absl::StatusOr<const CudaBatch*> Ours(const Batch& batch,
                                               Batch::Kind kind) {
    absl::Status s = CheckBatch(batch, kind);
    if (!s.ok()) return s;
    const auto* cuda = dynamic_cast<const CudaBatch*>(&batch);
    if (cuda == nullptr) {
      return absl::InvalidArgumentError(
          "a batch prepared by another device was run on a CUDA device");
    }
    return cuda;
  }

  const int ordinal_;
  cudaStream_t stream_;
  cudaEvent_t fence_;  // reused by WaitForStream: cudaStreamWaitEvent captures
                       // the event's state when it is called
};

}  // namespace

bool CudaCompiledIn() { return true; }

absl::StatusOr<std::unique_ptr<Device>> NewCudaDevice(int ordinal) {
  int count = 0;
  absl::Status s = CudaStatus(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (!s.ok()) return s;
  if (ordinal < 0 || ordinal >= count) {
    return absl::NotFoundError(
        absl::StrCat("no CUDA device ", ordinal, " (", count, " found)"));
  }
  s = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice");
  if (!s.ok()) return s;
  cudaStream_t stream;
  s = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                 "cudaStreamCreate");
  if (!s.ok()) return s;
  cudaEvent_t fence;
  s = CudaStatus(cudaEventCreateWithFlags(&fence, cudaEventDisableTiming),
                 "cudaEventCreate");
  if (!s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Device>(new CudaDevice(ordinal, stream, fence));
}

}  // namespace ckpt::kernels
