// The CUDA device: copies on its own stream, and byte-shuffle and chunk-hash
// kernels that match the CPU reference bit for bit. cudaError_t is converted
// to absl::Status only in CudaStatus().
#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "kernels/device.h"
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
// copied unchanged.
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

__constant__ uint8_t kDeviceSecret[xxh3::kSecretSize] = CKPT_XXH3_SECRET;

// XXH3-64 of every `chunk`-byte piece of [src, src + n) into out[], one warp
// per piece (grid-strided): each thread sums one accumulator lane of four
// stripes of a 1 KiB block, the warp adds the sums up by shuffles, and every
// thread keeps its lane's accumulator (kernels/xxh3.h; HashLongAsWarp is this
// loop on the host).
__global__ void HashChunksKernel(const uint8_t* src, size_t n, size_t chunk,
                                 uint64_t* out) {
  namespace x = xxh3;
  constexpr unsigned kAll = 0xffffffffu;
  const int t = static_cast<int>(threadIdx.x % x::kWarp);
  const int lane = t % 8;
  const size_t warps = static_cast<size_t>(gridDim.x) * blockDim.x / x::kWarp;
  const size_t chunks = (n + chunk - 1) / chunk;
  const uint8_t* secret = kDeviceSecret;
  for (size_t c = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) /
                  x::kWarp;
       c < chunks; c += warps) {
    const uint8_t* in = src + c * chunk;
    const size_t len = chunk < n - c * chunk ? chunk : n - c * chunk;
    if (len <= x::kMidSizeMax) {
      if (t == 0) out[c] = x::HashShort(in, len, secret);
      continue;
    }
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
    if (t == 0) out[c] = x::MergeAccs(all, secret, len);
  }
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
    const int threads = 256;
    const size_t blocks = std::min<size_t>((n + threads - 1) / threads, 65535);
    ByteShuffleKernel<<<static_cast<unsigned>(blocks), threads, 0, stream_>>>(
        static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), n, width);
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
    const int threads = 256;  // 8 warps, a piece each
    const size_t blocks = std::min<size_t>((chunks + 7) / 8, 65535);
    HashChunksKernel<<<static_cast<unsigned>(blocks), threads, 0, stream_>>>(
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
