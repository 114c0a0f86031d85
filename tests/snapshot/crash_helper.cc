// Writes the sample shard for `step` into `dir`: a real process for the SIGKILL
// crash tests, which arm a kill point through CKPT_KILL_POINT.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "io/file_system.h"
#include "tests/snapshot/sample_shard.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s DIR STEP SEED\n", argv[0]);
    return 2;
  }
  std::string dir = argv[1];
  uint64_t step = std::strtoull(argv[2], nullptr, 10);
  uint64_t seed = std::strtoull(argv[3], nullptr, 10);
  ckpt::testing::SampleShard sample(seed + step);
  absl::Status s =
      sample.Write(ckpt::io::DefaultFileSystem(),
                   dir + "/step-" + std::to_string(step) + ".shard", step);
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
