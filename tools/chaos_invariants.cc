// Part of ckpt-chaos: see tools/chaos.h.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "proto/daemon.grpc.pb.h"
#include "tools/chaos.h"

namespace ckpt::chaos {

std::vector<std::pair<proto::Tier, size_t>> Chaos::Promises() const {
  std::vector<std::pair<proto::Tier, size_t>> p = {
      {proto::TIER_MEMORY, kKeepMemory}, {proto::TIER_LOCAL_DISK, kKeepDisk}};
  if (multi()) {
    p.push_back({proto::TIER_PEER, 1});
    p.push_back({proto::TIER_SHARED, kKeepShared});
  }
  return p;
}

void Chaos::CheckInvariants(
    const std::string& after,
    const std::vector<std::pair<proto::Tier, size_t>>& at) {
  const std::string when = "after " + after;
  std::vector<std::unique_ptr<Checkpointer>> ranks;
  std::vector<ckpt::demo::RankModel> models;
  std::vector<std::string> rng(o_.ranks);
  models.reserve(o_.ranks);
  for (uint32_t r = 0; r < o_.ranks; ++r) {
    ranks.push_back(Connect(r));
    models.emplace_back(r, o_.elements);
    if (ranks.back() == nullptr) {
      Violation(when + ": cannot connect to ckptd");
      return;
    }
    const int64_t global = o_.elements * o_.ranks;
    auto& m = models.back();
    absl::Status s =
        ranks[r]->RegisterTensor("model/w", proto::DTYPE_FLOAT32, m.w.data(),
                                 {global}, {m.offset}, {o_.elements});
    if (s.ok()) {
      s = ranks[r]->RegisterTensor("optim/momentum", proto::DTYPE_FLOAT32,
                                   m.m.data(), {global}, {m.offset},
                                   {o_.elements});
    }
    if (s.ok()) {
      s = ranks[r]->RegisterTensor("model/embed", proto::DTYPE_FLOAT32,
                                   m.embed.data(), {global}, {m.offset},
                                   {o_.elements});
    }
    if (s.ok()) s = ranks[r]->RegisterBytes("rng", &rng[r]);
    if (!s.ok()) Violation(when + ": " + std::string(s.message()));
  }
  // Restores `step` on every rank: the bytes must be the expected ones.
  // Returns false if some rank could not restore it.
  // Restores `step` on every rank: the bytes must be the expected ones. A
  // failure is a violation when the step is `promised` at a tier: among the
  // newest `keep` commits there (re-checked after the failure, since the
  // job trains on and retention may drop the step in between).
  struct Promise {
    proto::Tier tier;
    size_t keep;
  };
  auto restores_exactly = [&](uint64_t step, std::optional<Promise> promised) {
    for (uint32_t r = 0; r < o_.ranks; ++r) {
      // Every byte must come from the restore, the frozen ones too (an
      // incremental save stores them in an earlier shard).
      for (auto* v : {&models[r].w, &models[r].m, &models[r].embed})
        std::fill(v->begin(), v->end(), -1.0f);
      absl::Status s = ranks[r]->Restore(step);
      if (!s.ok()) {
        if (promised.has_value() &&
            AmongNewest(ranks[0].get(), promised->tier, promised->keep, step)) {
          Violation(absl::StrCat(when, ": step ", step, ", committed at ",
                                 proto::Tier_Name(promised->tier),
                                 " and kept, does not restore on rank ", r,
                                 ": ", s.message()));
        }
        return false;
      }
      models[r].SetRng(rng[r]);
      if (models[r].Serialize() != oracle_.Expected(r, step)) {
        Violation(absl::StrCat(when, ": step ", step, " rank ", r,
                               " restored other bytes than the job saved"));
      }
    }
    ++checked_steps_;
    return true;
  };
  for (const auto& [tier, keep] : at) {
    const std::string name = proto::Tier_Name(tier);
    auto listed = ranks[0]->ListCommitted(tier);
    if (!listed.ok()) {
      Violation(when + ": listing " + name + ": " +
                std::string(listed.status().message()));
      continue;
    }
    if (listed->empty()) continue;
    const uint64_t newest = listed->back();
    uint64_t& seen = newest_seen_[tier];
    if (newest < seen) {
      Violation(absl::StrCat(when, ": the latest committed step at ", name,
                             " went backward from ", seen, " to ", newest));
    }
    seen = std::max(seen, newest);
    // Retention promises the newest `keep` commits; older records may
    // outlive their data.
    for (size_t i = 0; i < listed->size() && i < keep; ++i) {
      restores_exactly((*listed)[listed->size() - 1 - i], Promise{tier, keep});
    }
    // A few older ones: if they restore, they must be exact.
    for (int i = 0; i < 3 && listed->size() > keep; ++i) {
      restores_exactly((*listed)[std::uniform_int_distribution<size_t>(
                           0, listed->size() - keep - 1)(check_rng_)],
                       std::nullopt);
    }
  }
  // A step beyond the newest committed one is in flight at best: restoring
  // it fails, unless it was committed in between, and then it is exact.
  restores_exactly(newest_seen_[proto::TIER_MEMORY] + 1, std::nullopt);
}

void Chaos::Finish() {
  // Healthy again for the end: no fault pending.
  if (multi() && !etcd_->running() && !etcd_->Start()) return;
  for (Node& n : nodes_) {
    if (n.pid <= 0 && !StartDaemon(n, "")) return;
    (void)InjectDisk(n, 0, 0);
  }
  // Beyond every rank: one whose saves failed may be ahead of the commits.
  const uint64_t end =
      std::max(Latest(proto::TIER_MEMORY).value_or(0), Progress()) + 40;
  {
    std::ofstream(steps_file_ + ".tmp") << end << "\n";
    std::filesystem::rename(steps_file_ + ".tmp", steps_file_);
  }
  report_.final_step = end;
  Log(absl::StrCat("the job ends at step ", end));
  for (uint32_t r = 0; r < ranks_.size(); ++r) {
    if (ranks_[r] <= 0) continue;
    int status = 0;
    const Clock::time_point deadline = Clock::now() + std::chrono::seconds(180);
    while (!Exited(ranks_[r], &status) && Clock::now() < deadline) {
      SleepMs(10);
    }
    if (Clock::now() >= deadline) {
      KillAndReap(ranks_[r]);
      Violation(absl::StrCat("rank ", r, " did not finish; see ", log_));
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      Violation(absl::StrCat("rank ", r, " ended with status ", status,
                             "; see ", log_));
    }
    ranks_[r] = -1;
  }
  job_ended_ = Clock::now();
  CheckHealth();
  for (uint32_t r = 0; r < o_.ranks; ++r) {
    std::ifstream in(absl::StrCat(o_.dir, "/out/final-rank-", r, ".bin"),
                     std::ios::binary);
    std::string got((std::istreambuf_iterator<char>(in)),
                    std::istreambuf_iterator<char>());
    if (got != oracle_.Expected(r, end)) {
      Violation(absl::StrCat(
          "rank ", r, " ended with another state than an uninterrupted run of ",
          end, " steps", got.empty() ? " (it wrote none)" : "", "; ",
          ExplainResumes(r)));
    }
    std::ifstream stats(absl::StrCat(o_.dir, "/out/stats-rank-", r, ".txt"));
    uint64_t saves = 0;
    stats >> saves;
    report_.bytes_staged += saves * (o_.elements * 8 + 8);
  }
  CheckInvariants("the end");
  const auto latest_disk = Latest(proto::TIER_LOCAL_DISK);
  if (!latest_disk.has_value() || *latest_disk != end) {
    Violation(absl::StrCat("the last step ", end,
                           " is not the latest committed on disk"));
  }
}

std::string Chaos::ExplainResumes(uint32_t rank) {
  // The trainer logs "rank R: resumed from committed step S (state H)".
  std::ifstream in(log_);
  const std::string prefix = absl::StrCat("rank ", rank, ": resumed from ");
  std::string line;
  int resumes = 0;
  while (std::getline(in, line)) {
    unsigned long step = 0, digest = 0;
    unsigned int r = 0;
    if (line.rfind(prefix, 0) != 0 ||
        std::sscanf(line.c_str(),
                    "rank %u: resumed from committed step %lu (state %lx)", &r,
                    &step, &digest) != 3) {
      continue;
    }
    ++resumes;
    if (demo::Digest(oracle_.Expected(rank, step)) != digest) {
      return absl::StrCat("its restore of committed step ", step,
                          " returned another state than was saved (resume ",
                          resumes, " in ", log_, ")");
    }
  }
  return absl::StrCat("each of its ", resumes,
                      " restores returned the state saved; see ", log_);
}

bool Chaos::AmongNewest(Checkpointer* c, proto::Tier tier, size_t keep,
                        uint64_t step) {
  auto listed = c->ListCommitted(tier);
  if (!listed.ok()) return true;  // cannot tell: count it
  auto it = std::find(listed->begin(), listed->end(), step);
  return it != listed->end() && static_cast<size_t>(listed->end() - it) <= keep;
}

}  // namespace ckpt::chaos
