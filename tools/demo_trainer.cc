// ckpt-demo-trainer: one rank of the demo job. Resumes from the latest
// committed step, trains the toy model, saves asynchronously every step through
// libckpt, and writes its final state. A failed save (daemon down, budget
// exhausted) is reported and training goes on.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "tools/demo_model.h"

namespace {

using ckpt::client::Checkpointer;
namespace proto = ckpt::proto;

double Seconds(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t)
      .count();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt-demo-trainer: one rank of the demo job"};
  std::string socket, job = "demo", out;
  uint32_t rank = 0, world = 1;
  uint64_t steps = 50;
  int64_t elements = 1 << 20;
  int step_ms = 20;
  app.add_option("--socket", socket)->required();
  app.add_option("--job", job);
  app.add_option("--rank", rank)->required();
  app.add_option("--world", world)->required();
  app.add_option("--steps", steps);
  app.add_option("--elements", elements);
  app.add_option("--step-ms", step_ms, "simulated compute per step");
  std::string resume_tier = "memory";
  app.add_option("--resume-tier", resume_tier,
                 "resume from the latest step committed at this tier (peer "
                 "after a node was lost: its memory-tier steps may be gone "
                 "with it)")
      ->check(CLI::IsMember({"memory", "peer", "disk", "shared"}));
  app.add_option("--out", out)->required();
  std::string steps_file, progress_file;
  app.add_option("--progress-file", progress_file,
                 "rewritten with the step number after every step");
  app.add_option("--steps-file", steps_file,
                 "when this file appears, the job ends at the step it names "
                 "(ckpt-chaos ends a job of unknown length this way)");
  CLI11_PARSE(app, argc, argv);

  absl::StatusOr<std::unique_ptr<Checkpointer>> ckpt;
  for (int i = 0; i < 100; ++i) {  // the daemon may be restarting
    ckpt = Checkpointer::Connect({job, rank, world, socket});
    if (ckpt.ok()) break;
    usleep(100000);
  }
  if (!ckpt.ok()) {
    std::fprintf(stderr, "rank %u: %s\n", rank,
                 std::string(ckpt.status().message()).c_str());
    return 1;
  }
  ckpt::demo::RankModel model(rank, elements);
  std::string rng = model.RngBytes();
  int64_t global = elements * world;
  absl::Status s =
      (*ckpt)->RegisterTensor("model/w", proto::DTYPE_FLOAT32, model.w.data(),
                              {global}, {model.offset}, {elements});
  if (s.ok()) {
    s = (*ckpt)->RegisterTensor("optim/momentum", proto::DTYPE_FLOAT32,
                                model.m.data(), {global}, {model.offset},
                                {elements});
  }
  if (s.ok()) {
    s = (*ckpt)->RegisterTensor("model/embed", proto::DTYPE_FLOAT32,
                                model.embed.data(), {global}, {model.offset},
                                {elements});
  }
  if (s.ok()) s = (*ckpt)->RegisterBytes("rng", &rng);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %u: %s\n", rank,
                 std::string(s.message()).c_str());
    return 1;
  }

  uint64_t start = 1, resumed_from = 0;
  const proto::Tier resume = resume_tier == "peer"     ? proto::TIER_PEER
                             : resume_tier == "disk"   ? proto::TIER_LOCAL_DISK
                             : resume_tier == "shared" ? proto::TIER_SHARED
                                                       : proto::TIER_MEMORY;
  auto latest = (*ckpt)->LatestCommitted(resume);
  // The only copy of a shard may be on a node that is restarting (a replica
  // on a peer killed while this rank's own node was lost): a restore that
  // finds no live copy is tried again for a minute before the rank gives up.
  const auto give_up =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (latest.ok() && latest->has_value()) {
    s = (*ckpt)->Restore(**latest);
    const bool unreachable = absl::IsNotFound(s) || absl::IsUnavailable(s);
    if (s.ok() || !unreachable || std::chrono::steady_clock::now() > give_up)
      break;
    std::fprintf(
        stderr,
        "rank %u: restore of step %lu found no copy (%s); trying again\n", rank,
        static_cast<unsigned long>(**latest), std::string(s.message()).c_str());
    usleep(1000000);
    latest = (*ckpt)->LatestCommitted(resume);
  }
  if (latest.ok() && latest->has_value()) {
    if (!s.ok() || !model.SetRng(rng)) {
      std::fprintf(stderr, "rank %u: restore of step %lu failed: %s\n", rank,
                   static_cast<unsigned long>(**latest),
                   std::string(s.message()).c_str());
      return 1;
    }
    resumed_from = **latest;
    start = resumed_from + 1;
    std::printf(
        "rank %u: resumed from committed step %lu (state %016lx)\n", rank,
        static_cast<unsigned long>(resumed_from),
        static_cast<unsigned long>(ckpt::demo::Digest(model.Serialize())));
    std::fflush(stdout);
  }

  std::vector<double> stalls;
  int failed = 0;
  auto read_steps_file = [&] {
    if (steps_file.empty()) return;
    std::ifstream in(steps_file);
    uint64_t end = 0;
    if (in >> end && end > 0) steps = end;
  };
  read_steps_file();
  for (uint64_t step = start; step <= steps; ++step) {
    read_steps_file();
    if (step > steps) break;
    model.Step(step);
    rng = model.RngBytes();
    if (!progress_file.empty()) {
      std::ofstream(progress_file, std::ios::trunc) << step << "\n";
    }
    auto t = std::chrono::steady_clock::now();
    auto save = (*ckpt)->SaveAsync(step);
    absl::Status staged = save.ok() ? (*save)->WaitStaged() : save.status();
    if (staged.ok()) {
      stalls.push_back(Seconds(t));
    } else if (++failed <= 3) {
      std::fprintf(stderr,
                   "rank %u: save of step %lu failed, training goes on: %s\n",
                   rank, static_cast<unsigned long>(step),
                   std::string(staged.message()).c_str());
    }
    usleep(step_ms * 1000);
  }
  // The last step must be durable before the job ends. If its save was lost
  // (the daemon was down), save it again; then wait until every rank has it on
  // disk.
  bool durable = false;
  int failed_again = 0;
  for (int attempt = 0; attempt < 600 && !durable; ++attempt) {
    auto latest_disk = (*ckpt)->LatestCommitted(proto::TIER_LOCAL_DISK);
    if (latest_disk.ok() && latest_disk->has_value() &&
        **latest_disk >= steps) {
      durable = true;
      break;
    }
    auto shard = (*ckpt)->DescribeShard(steps);
    if (!shard.ok() && shard.status().code() == absl::StatusCode::kNotFound) {
      auto save = (*ckpt)->SaveAsync(steps);
      absl::Status staged = save.ok() ? (*save)->WaitStaged() : save.status();
      if (staged.ok()) staged = (*save)->WaitCommitted(proto::TIER_MEMORY);
      if (!staged.ok() && (++failed_again <= 3 || failed_again % 100 == 0)) {
        std::fprintf(stderr, "rank %u: saving step %lu again failed: %s\n",
                     rank, static_cast<unsigned long>(steps),
                     std::string(staged.message()).c_str());
      }
    }
    usleep(100000);
  }
  if (!durable) {
    auto shard = (*ckpt)->DescribeShard(steps);
    std::fprintf(stderr,
                 "rank %u: step %lu never became durable; its shard: %s\n",
                 rank, static_cast<unsigned long>(steps),
                 shard.ok() ? shard->ShortDebugString().substr(0, 400).c_str()
                            : std::string(shard.status().message()).c_str());
  }
  std::sort(stalls.begin(), stalls.end());
  std::ofstream(absl::StrCat(out, "/final-rank-", rank, ".bin"),
                std::ios::binary)
      << model.Serialize();
  std::ofstream(absl::StrCat(out, "/stats-rank-", rank, ".txt"))
      << stalls.size() << " " << failed << " "
      << (stalls.empty() ? 0.0 : stalls[stalls.size() / 2]) << " "
      << resumed_from << "\n";
  return durable ? 0 : 1;
}
