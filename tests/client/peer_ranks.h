// Helpers of the tests of the peer tier (replicas and parity) across real
// ckptd processes: ranks that save a float vector whose values are a function
// of the step and the global index (so any sharding of a step holds the same
// numbers), the arguments of a node on etcd, saving a step on every rank,
// and a forged shard file.
#ifndef CKPT_TESTS_CLIENT_PEER_RANKS_H_
#define CKPT_TESTS_CLIENT_PEER_RANKS_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "snapshot/shard_writer.h"
#include "tests/client/connected_rank.h"
#include "tests/daemon/etcd_process.h"

namespace ckpt::client {

// Incompressible values, a function of the step and the global index only, so
// that any sharding of the same step holds the same numbers.
inline float Value(uint64_t step, int64_t g) {
  uint64_t z = step * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(g);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return static_cast<float>(z >> 40) / 1024.0f;
}

// One rank's box of a global float vector, and its RNG byte item.
struct Rank {
  uint32_t rank, world;
  int64_t global, offset, length;
  std::vector<float> w;
  std::string rng;
  std::unique_ptr<Checkpointer> ckpt;

  Rank(const std::string& socket, const std::string& job, uint32_t rank,
       uint32_t world, int64_t global)
      : rank(rank),
        world(world),
        global(global),
        offset(global / world * rank),
        length(global / world),
        w(length) {
    ckpt = ConnectRank({job, rank, world, socket},
                       {w.data(), global, offset, length, &rng});
  }
  void Fill(uint64_t step) {
    for (int64_t i = 0; i < length; ++i) w[i] = Value(step, offset + i);
    rng = absl::StrCat("rng-", step, "-", rank);
  }
  // The state of `step`, except the RNG item of a rank the step did not have.
  bool Matches(uint64_t step, bool rng_too = true) const {
    for (int64_t i = 0; i < length; ++i) {
      if (w[i] != Value(step, offset + i)) return false;
    }
    return !rng_too || rng == absl::StrCat("rng-", step, "-", rank);
  }
};

inline std::vector<std::string> NodeArgs(const testing::EtcdProcess& etcd,
                                         const std::string& node,
                                         std::vector<std::string> more = {}) {
  std::vector<std::string> args = etcd.DaemonArgs();
  args.insert(args.end(),
              {"--lease-ttl", "2", "--node-id", node, "--peer-address",
               "127.0.0.1:0", "--peer-replicas", "1"});
  // What a lost node held is made again at once, as these tests expect,
  // unless the test says otherwise.
  if (std::find(more.begin(), more.end(), "--reprotect-delay") == more.end()) {
    args.insert(args.end(), {"--reprotect-delay", "0"});
  }
  args.insert(args.end(), more.begin(), more.end());
  return args;
}

// Saves `step` on every rank and waits until it is committed at `tier`.
inline absl::Status SaveAll(std::vector<Rank*> ranks, uint64_t step,
                            proto::Tier tier,
                            absl::Duration timeout = absl::Seconds(60)) {
  std::vector<std::shared_ptr<SaveHandle>> saves;
  for (Rank* r : ranks) {
    r->Fill(step);
    auto save = r->ckpt->SaveAsync(step);
    if (!save.ok()) return save.status();
    saves.push_back(*std::move(save));
  }
  for (auto& s : saves) {
    absl::Status st = s->WaitCommitted(tier, timeout);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

// A forged shard of `job`'s step `step`, rank 0 of 1, laid out as a Rank of
// `global` floats saves it (all `value`), written by a process without the
// cluster key: every checksum holds, no seal.
inline absl::Status WriteForged(const std::string& path, const std::string& job,
                                uint64_t step, int64_t global, float value) {
  std::vector<float> w(global, value);
  const std::string rng = "forged";
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path, {job, step, 0, 1},
                               {});
  absl::Status s = writer.AddTensor(
      {"model/w",
       proto::DTYPE_FLOAT32,
       {global},
       {0},
       {global},
       absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(w.data()),
                           w.size() * sizeof(float))});
  if (s.ok()) {
    s = writer.AddBytes(
        "rng", absl::MakeConstSpan(reinterpret_cast<const uint8_t*>(rng.data()),
                                   rng.size()));
  }
  return s.ok() ? writer.Commit().status() : s;
}

}  // namespace ckpt::client

#endif  // CKPT_TESTS_CLIENT_PEER_RANKS_H_
