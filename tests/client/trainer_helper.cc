// A trainer rank for crash tests, run as its own process so that it can be
// SIGKILLed anywhere (CKPT_KILL_POINT or a timer). It resumes from the latest
// step committed in memory (CKPT_TEST_DEVICE=cpu-queued: with its tensors
// on the GPU path's CPU twin), checks that what it restored is exactly the
// state of that step (exit 4 otherwise), and saves every step until --max-step.
//
//   trainer_helper SOCKET JOB RANK WORLD ELEMENTS MAX_STEP
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/time/clock.h"
#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif
#include "client/checkpointer.h"
#include "tests/client/rank_state.h"

namespace {

// CKPT_TEST_DEVICE=cuda: the rank's tensors in GPU memory, copied from the
// host state before each save and back after a restore (blocking copies on
// the default stream, which ckpt's stream follows).
class GpuMirror {
 public:
  GpuMirror(ckpt::testing::RankTensors& state, bool on) : state_(state) {
#ifdef CKPT_HAVE_CUDA
    if (on) {
      on_ = cudaMalloc(&w_, state.w.size() * sizeof(float)) == cudaSuccess &&
            cudaMalloc(&m_, state.m.size() * sizeof(double)) == cudaSuccess;
    }
#endif
  }
  bool on() const { return on_; }
  void* w() { return w_; }
  void* m() { return m_; }
  void ToDevice() {
#ifdef CKPT_HAVE_CUDA
    if (!on_) return;
    cudaMemcpy(w_, state_.w.data(), state_.w.size() * sizeof(float),
               cudaMemcpyHostToDevice);
    cudaMemcpy(m_, state_.m.data(), state_.m.size() * sizeof(double),
               cudaMemcpyHostToDevice);
#endif
  }
  void ToHost() {
#ifdef CKPT_HAVE_CUDA
    if (!on_) return;
    cudaMemcpy(state_.w.data(), w_, state_.w.size() * sizeof(float),
               cudaMemcpyDeviceToHost);
    cudaMemcpy(state_.m.data(), m_, state_.m.size() * sizeof(double),
               cudaMemcpyDeviceToHost);
#endif
  }

 private:
  ckpt::testing::RankTensors& state_;
  bool on_ = false;
  void* w_ = nullptr;
  void* m_ = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace ckpt;
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s SOCKET JOB RANK WORLD ELEMENTS MAX_STEP\n",
                 argv[0]);
    return 2;
  }
  client::CheckpointerOptions options;
  options.socket_path = argv[1];
  options.job = argv[2];
  options.rank = static_cast<uint32_t>(std::atoi(argv[3]));
  options.world_size = static_cast<uint32_t>(std::atoi(argv[4]));
  const int64_t elements = std::atoll(argv[5]);
  const uint64_t max_step = std::strtoull(argv[6], nullptr, 10);
  // CKPT_TEST_DEVICE=cpu-queued: the tensors are "device memory" of the CUDA
  // device's CPU twin (queued, gathered copies; hashes on the device);
  // CKPT_TEST_DEVICE=cuda: GPU memory, mirrored to the host state by copies.
  const char* device = std::getenv("CKPT_TEST_DEVICE");
  const std::string device_kind = device != nullptr ? device : "";
  if (device_kind == "cpu-queued") {
    options.device = client::DeviceKind::kCpuQueued;
  } else if (device_kind == "cuda") {
#ifdef CKPT_HAVE_CUDA
    options.device = client::DeviceKind::kCuda;
#else
    std::fprintf(stderr, "CKPT_TEST_DEVICE=cuda: built without CUDA\n");
    return 2;
#endif
  }
  auto ckpt = client::Checkpointer::Connect(options);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "connect: %s\n", ckpt.status().ToString().c_str());
    return 3;
  }
  testing::RankTensors state(options.rank, options.world_size, elements);
  GpuMirror gpu(state, options.device == client::DeviceKind::kCuda);
  if (options.device == client::DeviceKind::kCuda && !gpu.on()) {
    std::fprintf(stderr, "no GPU memory for the rank's tensors\n");
    return 3;
  }
  absl::Status registered = gpu.on()
                                ? state.Register(ckpt->get(), gpu.w(), gpu.m())
                                : state.Register(ckpt->get());
  if (!registered.ok()) {
    std::fprintf(stderr, "register: %s\n", registered.ToString().c_str());
    return 3;
  }
  uint64_t first = 1;
  auto latest = (*ckpt)->LatestCommitted(proto::TIER_MEMORY);
  if (!latest.ok()) {
    std::fprintf(stderr, "latest: %s\n", latest.status().ToString().c_str());
    return 3;
  }
  if (latest->has_value()) {
    absl::Status s = (*ckpt)->Restore(**latest);
    if (s.ok()) gpu.ToHost();
    if (!s.ok()) {
      std::fprintf(stderr, "restore of step %llu: %s\n",
                   static_cast<unsigned long long>(**latest),
                   s.ToString().c_str());
      return 4;
    }
    if (!state.Matches(**latest)) {
      std::fprintf(stderr, "restored step %llu differs from its saved state\n",
                   static_cast<unsigned long long>(**latest));
      return 4;
    }
    first = **latest + 1;
  }
  for (uint64_t step = first; step <= max_step; ++step) {
    state.Fill(step);
    gpu.ToDevice();
    auto save = (*ckpt)->SaveAsync(step);
    if (save.ok()) (void)(*save)->WaitStaged();
    if (save.ok() && step == max_step) {
      absl::Status s = (*save)->WaitCommitted(proto::TIER_LOCAL_DISK);
      if (!s.ok()) {
        std::fprintf(stderr, "last step: %s\n", s.ToString().c_str());
        return 5;
      }
    }
  }
  return 0;
}
