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
#include "client/checkpointer.h"
#include "tests/client/rank_state.h"

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
  // device's CPU twin (queued, gathered copies; hashes on the device).
  if (const char* d = std::getenv("CKPT_TEST_DEVICE");
      d != nullptr && std::string(d) == "cpu-queued") {
    options.device = client::DeviceKind::kCpuQueued;
  }
  auto ckpt = client::Checkpointer::Connect(options);
  if (!ckpt.ok()) {
    std::fprintf(stderr, "connect: %s\n", ckpt.status().ToString().c_str());
    return 3;
  }
  testing::RankTensors state(options.rank, options.world_size, elements);
  if (absl::Status s = state.Register(ckpt->get()); !s.ok()) {
    std::fprintf(stderr, "register: %s\n", s.ToString().c_str());
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
