// libckpt's CUDA device against a real ckptd (label `gpu`; skips visibly on
// machines without a GPU): tensors in device memory are saved through pinned
// staging slots, the trainer's compute stream is ordered after the copy, and
// Restore brings the bytes back into device memory.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "kernels/device.h"
#include "snapshot/dtype.h"
#include "tests/client/daemon_process.h"
#include "tests/client/rank_state.h"
#include "tests/test_util.h"
#ifdef CKPT_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace ckpt::client {
namespace {

#ifdef CKPT_HAVE_CUDA
#define ASSERT_CUDA(expr)                                                      \
  do {                                                                         \
    cudaError_t err_ = (expr);                                                 \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

TEST(CheckpointerGpuTest, SavesDeviceTensorsOrderedOnTheComputeStream) {
  auto probe = kernels::NewCudaDevice(0);
  if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
  testing::DaemonProcess daemon({"--keep-memory", "2"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();

  constexpr size_t kFloats = 16 << 20;  // 64 MiB
  const size_t bytes = kFloats * sizeof(float);
  std::vector<float> host(kFloats);
  for (size_t i = 0; i < kFloats; ++i) host[i] = static_cast<float>(i % 9973);
  float* tensor = nullptr;
  ASSERT_CUDA(cudaMalloc(&tensor, bytes));
  cudaStream_t compute;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  ASSERT_CUDA(cudaMemcpy(tensor, host.data(), bytes, cudaMemcpyHostToDevice));

  CheckpointerOptions options{"gpujob", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCuda;
  options.compute_stream = compute;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_TRUE((*ckpt)
                  ->RegisterTensor("w", proto::DTYPE_FLOAT32, tensor,
                                   {static_cast<int64_t>(kFloats)}, {0},
                                   {static_cast<int64_t>(kFloats)})
                  .ok());
  for (uint64_t step = 1; step <= 3; ++step) {
    auto save = (*ckpt)->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    // The next "kernel" overwrites the state at once, without WaitStaged: it
    // must run after the copy because the stream waits for it.
    ASSERT_CUDA(cudaMemsetAsync(tensor, 0xff, bytes, compute));
    ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    ASSERT_CUDA(cudaStreamSynchronize(compute));
    ASSERT_CUDA(cudaMemcpy(tensor, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  EXPECT_GE((*ckpt)->stats().slots_reused, 1u) << "pinned slots are reused";
  // 64 MiB in 4 MiB chunks, three saves: hashed by the GPU's kernel, and
  // good, or the restores below would fail their checks.
  EXPECT_EQ((*ckpt)->stats().chunks_hashed_on_device, 3u * 16u);

  ASSERT_CUDA(cudaMemset(tensor, 0, bytes));
  ASSERT_TRUE((*ckpt)->Restore(3).ok());
  std::vector<float> back(kFloats);
  ASSERT_CUDA(cudaMemcpy(back.data(), tensor, bytes, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), host.data(), bytes), 0)
      << "memory-tier restore into device memory";

  // The shard file path: the slot is dropped from the memory tier first.
  auto shard = (*ckpt)->DescribeShard(1);
  ASSERT_TRUE(shard.ok()) << shard.status();
  if (shard->slot_path().empty()) {
    ASSERT_CUDA(cudaMemset(tensor, 0, bytes));
    ASSERT_TRUE((*ckpt)->Restore(1).ok());
    ASSERT_CUDA(cudaMemcpy(back.data(), tensor, bytes, cudaMemcpyDeviceToHost));
    EXPECT_EQ(std::memcmp(back.data(), host.data(), bytes), 0)
        << "disk restore into device memory";
  }
  ckpt->reset();
  cudaStreamDestroy(compute);
  cudaFree(tensor);
}
// With order_compute_stream off, the trainer's kernels that do not touch the
// state (a forward pass) run while the save copies; OrderStream makes the
// optimizer step wait for the copy without blocking the host, and the saved
// bytes are the pre-step bytes.
TEST(CheckpointerGpuTest, TheComputeStreamRunsWhileASaveCopies) {
  auto probe = kernels::NewCudaDevice(0);
  if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
  testing::DaemonProcess daemon({"--memory-budget", "4G"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  constexpr size_t kState = size_t{1} << 30, kActivations = 64 << 20;
  void* state = nullptr;
  void* activations = nullptr;
  ASSERT_CUDA(cudaMalloc(&state, kState));
  ASSERT_CUDA(cudaMalloc(&activations, kActivations));
  ASSERT_CUDA(cudaMemset(state, 0x11, kState));
  cudaStream_t compute;
  ASSERT_CUDA(cudaStreamCreateWithFlags(&compute, cudaStreamNonBlocking));
  cudaEvent_t forward;
  ASSERT_CUDA(cudaEventCreate(&forward));
  CheckpointerOptions options{"gpuoverlap", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCuda;
  options.compute_stream = compute;
  options.order_compute_stream = false;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const int64_t floats = kState / 4;
  ASSERT_TRUE((*ckpt)
                  ->RegisterTensor("w", proto::DTYPE_FLOAT32, state, {floats},
                                   {0}, {floats})
                  .ok());
  ASSERT_CUDA(cudaDeviceSynchronize());
  auto save = (*ckpt)->SaveAsync(1);
  ASSERT_TRUE(save.ok()) << save.status();
  // The forward pass: 64 MiB written while 1 GiB crosses to the host.
  ASSERT_CUDA(cudaMemsetAsync(activations, 0x22, kActivations, compute));
  ASSERT_CUDA(cudaEventRecord(forward, compute));
  ASSERT_TRUE((*save)->OrderStream(compute).ok());
  ASSERT_CUDA(cudaMemsetAsync(state, 0x33, kState, compute));  // the step
  ASSERT_CUDA(cudaEventSynchronize(forward));
  const bool copying = !(*save)->Staged();
  ASSERT_TRUE((*save)->WaitCommitted(proto::TIER_MEMORY).ok());
  ASSERT_CUDA(cudaStreamSynchronize(compute));
  EXPECT_TRUE(copying) << "the forward pass waited for the save's copy";

  ASSERT_CUDA(cudaMemset(state, 0, kState));
  ASSERT_TRUE((*ckpt)->Restore(1).ok());
  std::vector<uint8_t> back(kState);
  ASSERT_CUDA(cudaMemcpy(back.data(), state, kState, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::count(back.begin(), back.end(), 0x11),
            static_cast<ptrdiff_t>(kState))
      << "the saved bytes are the state before the step";
  ckpt->reset();
  cudaEventDestroy(forward);
  cudaStreamDestroy(compute);
  cudaFree(state);
  cudaFree(activations);
}

// 2000 device tensors of every dtype, 4 KiB to 1 MiB (log-uniform), gathered
// by a few launches, and one of 4 GiB copied by itself: all bit-exact after a
// restore from the memory tier.
TEST(CheckpointerGpuTest, SmallTensorsOfEveryDtypeAndOneOf4GiBAreBitExact) {
  auto probe = kernels::NewCudaDevice(0);
  if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
  testing::DaemonProcess daemon({"--memory-budget", "12G"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  constexpr int kSmall = 2000;
  // CKPT_GPU_LARGE_MIB: a smaller large tensor where /dev/shm is small
  // (tools/gpu-check.sh sets it from the room there).
  size_t large_mib = 4096;
  if (const char* e = std::getenv("CKPT_GPU_LARGE_MIB")) {
    large_mib = std::max<size_t>(1, std::strtoull(e, nullptr, 10));
  }
  const size_t kLarge = large_mib << 20;
  std::vector<std::vector<uint8_t>> host;
  std::vector<proto::DType> dtypes;
  for (int i = 0; i < kSmall; ++i) {
    const auto dtype = static_cast<proto::DType>(1 + i % 15);
    const size_t width = snapshot::DTypeSize(dtype);
    const size_t bytes = static_cast<size_t>(
        std::exp2(12 + std::uniform_real_distribution<>(0, 8)(rng)));
    host.push_back(testing::RandomBytes(rng, bytes / width * width));
    dtypes.push_back(dtype);
  }
  host.emplace_back(kLarge);
  dtypes.push_back(proto::DTYPE_BFLOAT16);
  uint64_t x = seed | 1;
  for (size_t i = 0; i < kLarge; i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(host.back().data() + i, &x, 8);
  }
  std::vector<void*> on_device(host.size());
  for (size_t i = 0; i < host.size(); ++i) {
    ASSERT_CUDA(cudaMalloc(&on_device[i], host[i].size()));
    ASSERT_CUDA(cudaMemcpy(on_device[i], host[i].data(), host[i].size(),
                           cudaMemcpyHostToDevice));
  }
  CheckpointerOptions options{"gpumany", 0, 1, daemon.socket()};
  options.device = DeviceKind::kCuda;
  auto ckpt = Checkpointer::Connect(options);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  for (size_t i = 0; i < host.size(); ++i) {
    const int64_t n =
        static_cast<int64_t>(host[i].size() / snapshot::DTypeSize(dtypes[i]));
    ASSERT_TRUE((*ckpt)
                    ->RegisterTensor("t" + std::to_string(i), dtypes[i],
                                     on_device[i], {n}, {0}, {n})
                    .ok());
  }
  auto save = (*ckpt)->SaveAsync(1);
  ASSERT_TRUE(save.ok()) << save.status();
  absl::Status committed = (*save)->WaitCommitted(proto::TIER_MEMORY);
  ASSERT_TRUE(committed.ok()) << committed << "\n" << daemon.log();
  EXPECT_EQ((*ckpt)->stats().tensors_gathered, static_cast<uint64_t>(kSmall));
  EXPECT_GE((*ckpt)->stats().gather_launches, 1u);
  EXPECT_EQ((*ckpt)->stats().gather_refused, "");

  for (void* p : on_device) {
    ASSERT_CUDA(cudaMemset(p, 0, 1));  // a restore that misses a tensor fails
  }
  ASSERT_CUDA(cudaDeviceSynchronize());
  absl::Status restored = (*ckpt)->Restore(1);
  ASSERT_TRUE(restored.ok()) << restored;
  std::vector<uint8_t> back;
  for (size_t i = 0; i < host.size(); ++i) {
    back.resize(host[i].size());
    ASSERT_CUDA(cudaMemcpy(back.data(), on_device[i], back.size(),
                           cudaMemcpyDeviceToHost));
    ASSERT_TRUE(back == host[i]) << "tensor " << i << " of " << back.size()
                                 << " bytes, dtype " << dtypes[i];
  }
  ckpt->reset();
  for (void* p : on_device) cudaFree(p);
}
// A trainer whose tensors are in GPU memory is SIGKILLed at random points of
// its saves (queued copies in flight, a slot half staged, before the hand-over)
// and restarted: it restores the latest committed step and checks it (exit 4
// otherwise), and what is committed at the end is exactly a step's state.
TEST(CheckpointerGpuTest, ATrainerKilledMidCopyNeverCommitsAPartialStep) {
  auto probe = kernels::NewCudaDevice(0);
  if (!probe.ok()) GTEST_SKIP() << "no usable GPU: " << probe.status();
  probe->reset();
  testing::DaemonProcess daemon({"--keep-memory", "2"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  // $CKPT_TEST_TRAINER_HELPER: the one tools/gpu-check.sh carries.
  const char* forced = std::getenv("CKPT_TEST_TRAINER_HELPER");
  const std::string helper =
      forced != nullptr && forced[0] != '\0' ? forced : TRAINER_HELPER;
  const char* const kPoints[] = {"client.after_begin_stage",
                                 "client.item_copied",
                                 "client.before_stage_complete"};
  std::mt19937_64 rng(testing::TestSeed());
  constexpr int64_t kElements = 1 << 18;  // 1 MiB each: gathered
  constexpr int kRounds = 8;
  for (int round = 0; round <= kRounds; ++round) {
    const bool last = round == kRounds;
    std::vector<std::string> env;
    for (char** e = environ; *e != nullptr; ++e) {
      if (std::string(*e).rfind("CKPT_KILL_POINT=", 0) != 0) env.push_back(*e);
    }
    env.push_back("CKPT_TEST_DEVICE=cuda");
    if (!last) {
      env.push_back(
          absl::StrCat("CKPT_KILL_POINT=", kPoints[rng() % std::size(kPoints)],
                       ":", 1 + rng() % 4));
    }
    std::vector<std::string> args = {helper,
                                     daemon.socket(),
                                     "gpukill",
                                     "0",
                                     "1",
                                     std::to_string(kElements),
                                     last ? "100000" : "1000000"};
    if (last) {
      auto latest = Checkpointer::Connect({"gpukill", 0, 1, daemon.socket()});
      ASSERT_TRUE(latest.ok());
      auto step = (*latest)->LatestCommitted(proto::TIER_MEMORY);
      ASSERT_TRUE(step.ok());
      args.back() = std::to_string(step->value_or(0) + 3);
    }
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    for (auto& e : env) envp.push_back(e.data());
    argv.push_back(nullptr);
    envp.push_back(nullptr);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::execve(helper.c_str(), argv.data(), envp.data());
      ::_exit(127);
    }
    ASSERT_GT(pid, 0);
    int status = 0;
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    while (::waitpid(pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        FAIL() << "round " << round << ": the trainer did not end";
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    if (last) {
      ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "the last round exits 0 (restored and checked): status " << status
          << "\n"
          << daemon.log();
    } else {
      ASSERT_FALSE(WIFEXITED(status) && WEXITSTATUS(status) == 4)
          << "round " << round << ": restored a state other than committed";
      ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
          << "round " << round << ": status " << status;
    }
  }
  // What is committed is exactly a step's state, read on the host.
  auto reader = Checkpointer::Connect({"gpukill", 0, 1, daemon.socket()});
  ASSERT_TRUE(reader.ok());
  testing::RankTensors state(0, 1, kElements);
  ASSERT_TRUE(state.Register(reader->get()).ok());
  auto restored = (*reader)->RestoreLatest(proto::TIER_LOCAL_DISK);
  ASSERT_TRUE(restored.ok()) << restored.status();
  ASSERT_TRUE(restored->has_value());
  EXPECT_EQ(state.Mismatch(**restored), "") << "step " << **restored;
}
#else
TEST(CheckpointerGpuTest, ATrainerKilledMidCopyNeverCommitsAPartialStep) {
  GTEST_SKIP() << "built without CUDA";
}
TEST(CheckpointerGpuTest, SavesDeviceTensorsOrderedOnTheComputeStream) {
  GTEST_SKIP() << "built without CUDA";
}
TEST(CheckpointerGpuTest, SmallTensorsOfEveryDtypeAndOneOf4GiBAreBitExact) {
  GTEST_SKIP() << "built without CUDA";
}
TEST(CheckpointerGpuTest, TheComputeStreamRunsWhileASaveCopies) {
  GTEST_SKIP() << "built without CUDA";
}
#endif

}  // namespace
}  // namespace ckpt::client
