// ckpt-demo: the main job on the embedded default. Starts a local ckptd and a
// job of N rank processes that train a deterministic toy model and save
// asynchronously every step; SIGKILLs a rank in the middle of the run (the job
// restarts and resumes from the latest committed step), later SIGKILLs the
// daemon mid-persist and restarts it (the ranks keep training; their saves fail
// meanwhile and work again after), then checks that every rank's final state is
// bit-identical to an uninterrupted run, verifies the last committed shards,
// and reports.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "io/file_system.h"
#include "snapshot/shard_reader.h"
#include "tools/demo_model.h"
#include "tools/process.h"

namespace {

namespace proto = ckpt::proto;
using ckpt::tools::Sibling;
using ckpt::tools::Spawn;

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "ckpt-demo: train, kill, resume, and prove nothing committed was lost"};
  std::string dir;
  uint32_t ranks = 4;
  uint64_t steps = 60;
  int64_t elements = 1 << 20;
  uint64_t seed = std::random_device{}();
  std::string ckptd = Sibling("../daemon/ckptd"),
              trainer = Sibling("ckpt-demo-trainer");
  app.add_option("--dir", dir,
                 "working directory (default: a new temporary one)");
  app.add_option("--ranks", ranks)->check(CLI::Range(1, 64));
  app.add_option("--steps", steps)->check(CLI::Range(10, 100000));
  app.add_option("--elements", elements,
                 "float32 elements per rank per tensor");
  app.add_option("--seed", seed, "when the kills happen");
  app.add_option("--ckptd", ckptd);
  app.add_option("--trainer", trainer);
  CLI11_PARSE(app, argc, argv);
  if (dir.empty())
    dir = (std::filesystem::temp_directory_path() /
           absl::StrCat("ckpt-demo-", ::getpid()))
              .string();
  std::filesystem::create_directories(dir + "/out");
  const std::string socket = dir + "/run/ckptd.sock";
  const std::string staging =
      absl::StrCat("/dev/shm/ckpt-demo-staging-", ::getpid());
  const std::string log = dir + "/demo.log";
  std::printf(
      "ckpt-demo: %u ranks x %lu steps, 2 x %.1f MiB of float32 per rank, seed "
      "%lu\n",
      ranks, static_cast<unsigned long>(steps), elements * 4.0 / (1 << 20),
      static_cast<unsigned long>(seed));
  std::printf("  working directory %s (logs in demo.log)\n", dir.c_str());
  std::mt19937_64 rng(seed);

  auto start_daemon = [&] {
    pid_t pid = Spawn({ckptd, "--socket", socket, "--data-dir", dir + "/data",
                       "--staging-dir", staging, "--memory-budget", "2G",
                       "--keep-memory", "2", "--keep-disk", "2"},
                      log);
    for (int i = 0; i < 200; ++i) {
      if (ckpt::client::Checkpointer::Connect({"demo", 0, ranks, socket}).ok())
        return pid;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::fprintf(stderr, "ckpt-demo: ckptd did not start; see %s\n",
                 log.c_str());
    std::exit(1);
  };
  auto start_rank = [&](uint32_t r) {
    return Spawn(
        {trainer, "--socket", socket, "--rank", std::to_string(r), "--world",
         std::to_string(ranks), "--steps", std::to_string(steps), "--elements",
         std::to_string(elements), "--out", dir + "/out"},
        log);
  };
  auto latest = [&](proto::Tier tier) -> uint64_t {
    auto c = ckpt::client::Checkpointer::Connect({"demo", 0, ranks, socket});
    if (!c.ok()) return 0;
    auto l = (*c)->LatestCommitted(tier);
    return l.ok() && l->has_value() ? **l : 0;
  };
  auto wait_until = [&](uint64_t step) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::minutes(3);
    while (latest(proto::TIER_MEMORY) < step) {
      if (std::chrono::steady_clock::now() > deadline) {
        std::fprintf(
            stderr,
            "ckpt-demo: step %lu was not committed in 3 minutes; see %s\n",
            static_cast<unsigned long>(step), log.c_str());
        std::exit(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  };

  const auto t0 = std::chrono::steady_clock::now();
  pid_t daemon = start_daemon();
  std::vector<pid_t> pids;
  for (uint32_t r = 0; r < ranks; ++r) pids.push_back(start_rank(r));

  // 1. A rank dies mid-save; the job restarts and resumes from the latest
  // committed step.
  wait_until(steps / 4);
  std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
  const uint32_t victim = ranks > 2 ? 2 : 0;
  ::kill(pids[victim], SIGKILL);
  uint64_t at_kill = latest(proto::TIER_MEMORY);
  std::printf(
      "  SIGKILL rank %u while saving (latest committed step %lu); restarting "
      "the job\n",
      victim, static_cast<unsigned long>(at_kill));
  for (pid_t p : pids) ::kill(p, SIGKILL);
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  pids.clear();
  for (uint32_t r = 0; r < ranks; ++r) pids.push_back(start_rank(r));

  // 2. The daemon dies mid-persist and comes back; the ranks train on.
  wait_until(steps * 3 / 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
  ::kill(daemon, SIGKILL);
  ::waitpid(daemon, nullptr, 0);
  std::printf("  SIGKILL ckptd mid-persist; restarting it\n");
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  daemon = start_daemon();

  bool ok = true;
  for (uint32_t r = 0; r < ranks; ++r) {
    int status = 0;
    ::waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "ckpt-demo: rank %u failed (status %d); see %s\n", r,
                   status, log.c_str());
      ok = false;
    }
  }
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
          .count();

  // 3. Bit-identical to an uninterrupted run; the last committed shards verify.
  uint64_t saves = 0, failed = 0, raw = 0, stored = 0;
  double persist_s = 0;
  std::vector<double> stalls;
  for (uint32_t r = 0; r < ranks && ok; ++r) {
    ckpt::demo::RankModel reference(r, elements);
    for (uint64_t s = 1; s <= steps; ++s) reference.Step(s);
    std::ifstream in(absl::StrCat(dir, "/out/final-rank-", r, ".bin"),
                     std::ios::binary);
    std::stringstream got;
    got << in.rdbuf();
    if (got.str() != reference.Serialize()) {
      std::fprintf(
          stderr,
          "ckpt-demo: rank %u's final state differs from the reference\n", r);
      ok = false;
    }
    std::ifstream stats(absl::StrCat(dir, "/out/stats-rank-", r, ".txt"));
    uint64_t n = 0, f = 0, resumed = 0;
    double stall = 0;
    stats >> n >> f >> stall >> resumed;
    saves += n;
    failed += f;
    stalls.push_back(stall);
    auto c = ckpt::client::Checkpointer::Connect({"demo", r, ranks, socket});
    auto shard = c.ok() ? (*c)->DescribeShard(steps) : c.status();
    if (!shard.ok() || shard->state() != proto::SHARD_PERSISTED) {
      std::fprintf(stderr, "ckpt-demo: rank %u step %lu is not persisted\n", r,
                   static_cast<unsigned long>(steps));
      ok = false;
      continue;
    }
    if (!ckpt::snapshot::VerifyShard(ckpt::io::DefaultFileSystem(),
                                     shard->shard_path())
             .empty()) {
      std::fprintf(stderr, "ckpt-demo: %s does not verify\n",
                   shard->shard_path().c_str());
      ok = false;
    }
    raw += shard->raw_bytes();
    stored += shard->stored_bytes();
    persist_s +=
        (shard->persisted_unix_micros() - shard->staged_unix_micros()) / 1e6;
  }
  ::kill(daemon, SIGTERM);
  ::waitpid(daemon, nullptr, 0);
  std::filesystem::remove_all(staging);
  if (!ok) {
    std::printf("ckpt-demo: FAILED\n");
    return 1;
  }
  std::sort(stalls.begin(), stalls.end());
  std::printf(
      "  final state of every rank is bit-identical to an uninterrupted run\n");
  std::printf(
      "  steps %lu, saves staged %lu, saves failed while ckptd was down %lu\n",
      static_cast<unsigned long>(steps), static_cast<unsigned long>(saves),
      static_cast<unsigned long>(failed));
  std::printf(
      "  stall per save (SaveAsync+WaitStaged, median of ranks) %.2f ms for "
      "%.1f MiB\n",
      stalls[stalls.size() / 2] * 1e3, elements * 8.0 / (1 << 20));
  std::printf(
      "  persist %.0f MiB/s per shard (last step), compression %.3f "
      "stored/raw\n",
      raw / (1 << 20) / std::max(persist_s, 1e-9),
      static_cast<double>(stored) / std::max<uint64_t>(raw, 1));
  std::printf(
      "  recoveries: 1 job restart after a rank kill, 1 daemon restart; %.1f s "
      "total\n",
      wall);
  std::printf("ckpt-demo: OK\n");
  return 0;
}
