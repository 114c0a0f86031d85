#include "daemon/health/goodput.h"

#include <algorithm>
#include <vector>

namespace ckpt::daemon {

Goodput::Goodput(Metrics* metrics, Persist persist)
    : metrics_(metrics), persist_(std::move(persist)) {
  metrics_->Declare("ckpt_goodput_seconds", Metrics::Type::kGauge,
                    "the job's wall time as this node saw it, by kind: "
                    "training, stall (saves' copies), recovery (failure to "
                    "training again), lost (work redone after a resume)");
  metrics_->Declare("ckpt_ettr", Metrics::Type::kGauge,
                    "effective training time ratio: training over wall time");
  metrics_->OnScrape([this](Metrics& m) { Scrape(m); });
}

void Goodput::Advance(Job& j, absl::Time at) {
  proto::GoodputRecord& r = j.record;
  const absl::Time mark = absl::FromUnixMicros(r.mark_unix_micros());
  if (r.mark_unix_micros() != 0 && at <= mark) return;
  if (r.running() && r.mark_unix_micros() != 0) {
    const double dt = absl::ToDoubleSeconds(at - mark);
    if (r.recovering()) {
      r.set_recovery_s(r.recovery_s() + dt);
    } else if (!j.staging.empty()) {
      r.set_stall_s(r.stall_s() + dt);
    } else {
      r.set_training_s(r.training_s() + dt);
    }
  }
  r.set_mark_unix_micros(absl::ToUnixMicros(at));
}

void Goodput::EndRecovery(Job& j, absl::Time at) {
  proto::GoodputRecord& r = j.record;
  if (r.daemon_down() && j.resumed_step == UINT64_MAX) {
    // ckptd went down under trainers that went on: they trained meanwhile.
    const double trained =
        std::max(0.0, r.recovery_s() - r.recovery_at_failure_s());
    r.set_recovery_s(r.recovery_s() - trained);
    r.set_training_s(r.training_s() + trained);
  } else if (j.resumed_at < at && j.resumed_at != absl::InfinitePast()) {
    // Trained since the last resume: not recovery.
    const double trained =
        std::min(r.recovery_s(), absl::ToDoubleSeconds(at - j.resumed_at));
    r.set_recovery_s(r.recovery_s() - trained);
    r.set_training_s(r.training_s() + trained);
  }
  if (j.resumed_step != UINT64_MAX) {
    auto& steps = *r.mutable_training_at_step();
    // The training time when the resumed step's save began (none kept: the
    // job resumed from before anything seen here, all of it is lost).
    double base = 0;
    std::optional<uint64_t> best;
    for (const auto& [step, training] : steps) {
      if (step <= j.resumed_step && (!best.has_value() || step > *best)) {
        best = step;
        base = training;
      }
    }
    const double lost =
        std::clamp(r.training_at_failure_s() - base, 0.0, r.training_s());
    r.set_training_s(r.training_s() - lost);
    r.set_lost_s(r.lost_s() + lost);
    for (auto it = steps.begin(); it != steps.end();) {
      it = it->first > j.resumed_step ? steps.erase(it) : std::next(it);
    }
  }
  r.set_recovering(false);
  r.set_daemon_down(false);
  j.failed_rank = -1;
  j.resumed_at = absl::InfinitePast();
  j.resumed_step = UINT64_MAX;
}

std::optional<proto::GoodputRecord> Goodput::Due(Job& j, absl::Time at,
                                                 bool force) {
  if (!force && at - j.persisted < kPersistEvery) return std::nullopt;
  j.persisted = at;
  return j.record;
}

void Goodput::Publish(const std::optional<proto::GoodputRecord>& record) {
  if (record.has_value() && persist_) persist_(*record);
}

void Goodput::Restore(const proto::GoodputRecord& record, absl::Time now) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[record.job()];
    j.record = record;
    j.was_running = record.running();
    if (record.running()) {
      // ckptd went down under the job: recovering since its record's mark
      // (unless its trainers went on, which their next save tells).
      if (!record.recovering()) {
        j.record.set_recovering(true);
        j.record.set_training_at_failure_s(record.training_s());
        j.record.set_recovery_at_failure_s(record.recovery_s());
      }
      j.record.set_daemon_down(true);
    }
    Advance(j, now);
    due = Due(j, now, /*force=*/true);
  }
  Publish(due);
}

std::optional<bool> Goodput::WasRunning(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return std::nullopt;
  return it->second.was_running;
}

void Goodput::SessionBegun(const std::string& job, uint32_t pid, absl::Time at,
                           absl::Time launched) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    const absl::Time stopped =
        j.record.mark_unix_micros() == 0
            ? absl::InfinitePast()
            : absl::FromUnixMicros(j.record.mark_unix_micros());
    Advance(j, at);
    j.sessions.insert(pid);
    const bool starts = !j.record.running();
    if (starts) {
      // The trainer's start-up, not seen until now (and not before the
      // clock stopped).
      launched = std::clamp(launched, std::min(stopped, at), at);
      j.record.set_job(job);
      j.record.set_running(true);
      j.record.set_recovery_s(j.record.recovery_s() +
                              absl::ToDoubleSeconds(at - launched));
      if (j.record.first_unix_micros() == 0)
        j.record.set_first_unix_micros(absl::ToUnixMicros(launched));
    }
    due = Due(j, at, starts);
  }
  Publish(due);
}

void Goodput::SessionEnded(const std::string& job, uint32_t pid, absl::Time at,
                           bool clean) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    Advance(j, at);
    if (auto it = j.sessions.find(pid); it != j.sessions.end())
      j.sessions.erase(it);
    if (!j.sessions.empty() || !j.record.running()) return;
    j.staging.clear();
    if (j.record.recovering()) {
      if (!clean) return;  // the job comes back
      EndRecovery(j, at);  // its trainers ran until they ended
    }
    j.record.set_running(false);  // its clock stops
    due = Due(j, at, /*force=*/true);
  }
  Publish(due);
}

void Goodput::StagingBegun(const std::string& job, uint64_t step, uint32_t rank,
                           absl::Time at) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    Advance(j, at);
    const bool recovered =
        j.record.recovering() &&
        (j.failed_rank < 0 || static_cast<uint32_t>(j.failed_rank) == rank);
    if (recovered) EndRecovery(j, at);
    if (!j.record.running()) {  // a save outside a session (an old client)
      j.record.set_job(job);
      j.record.set_running(true);
      if (j.record.first_unix_micros() == 0)
        j.record.set_first_unix_micros(absl::ToUnixMicros(at));
    }
    j.staging[rank] = at;
    auto& steps = *j.record.mutable_training_at_step();
    steps.insert({step, j.record.training_s()});  // the first rank's
    if (steps.size() > kStepsKept) {
      // Every other step goes: the history spans twice as long, coarser (a
      // resume from a step between two kept ones counts from the older).
      std::vector<uint64_t> kept;
      for (const auto& entry : steps) kept.push_back(entry.first);
      std::sort(kept.begin(), kept.end());
      for (size_t i = 1; i + 1 < kept.size(); i += 2) steps.erase(kept[i]);
    }
    // Kept at the end of a recovery only: the periodic record is made at
    // Staged, off the path that starts a trainer's copy.
    if (recovered) due = Due(j, at, /*force=*/true);
  }
  Publish(due);
}

void Goodput::Staged(const std::string& job, uint32_t rank, absl::Time at) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    Advance(j, at);
    j.staging.erase(rank);
    due = Due(j, at, /*force=*/false);
  }
  Publish(due);
}

void Goodput::Failed(const std::string& job, absl::Time at, int rank,
                     absl::Duration unseen) {
  std::optional<proto::GoodputRecord> due;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    Advance(j, at);
    j.record.set_job(job);
    j.staging.clear();  // a dead rank's copy ends with it
    if (!j.record.recovering()) {
      proto::GoodputRecord& r = j.record;
      const double stopped =
          std::min(r.training_s(), absl::ToDoubleSeconds(unseen));
      if (r.running() && stopped > 0) {
        r.set_training_s(r.training_s() - stopped);
        r.set_recovery_s(r.recovery_s() + stopped);
      }
      j.record.set_recovering(true);
      j.record.set_training_at_failure_s(j.record.training_s());
      j.record.set_recovery_at_failure_s(j.record.recovery_s());
      j.resumed_at = absl::InfinitePast();
      j.resumed_step = UINT64_MAX;
      j.failed_rank = rank;
    }
    if (!j.record.running()) {
      j.record.set_running(true);
      if (j.record.first_unix_micros() == 0)
        j.record.set_first_unix_micros(absl::ToUnixMicros(at));
    }
    due = Due(j, at, /*force=*/true);
  }
  Publish(due);
}

void Goodput::Resumed(const std::string& job, uint64_t step, absl::Time at) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  Advance(j, at);
  if (!j.record.recovering()) return;
  j.resumed_at = at;
  j.resumed_step = std::min(j.resumed_step, step);
}

Goodput::Split Goodput::SplitOf(const proto::GoodputRecord& r) {
  Split s;
  s.training = r.training_s();
  s.stall = r.stall_s();
  s.recovery = r.recovery_s();
  s.lost = r.lost_s();
  return s;
}

Goodput::Split Goodput::Of(const std::string& job, absl::Time now) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) return Split{};
  Job copy = it->second;
  Advance(copy, now);
  return SplitOf(copy.record);
}

void Goodput::Scrape(Metrics& m) {
  std::vector<std::pair<std::string, Split>> splits;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    for (const auto& [job, j] : jobs_) {
      Job copy = j;
      Advance(copy, now);
      splits.push_back({job, SplitOf(copy.record)});
    }
  }
  for (const auto& [job, s] : splits) {
    m.Set("ckpt_goodput_seconds", {{"job", job}, {"kind", "training"}},
          s.training);
    m.Set("ckpt_goodput_seconds", {{"job", job}, {"kind", "stall"}}, s.stall);
    m.Set("ckpt_goodput_seconds", {{"job", job}, {"kind", "recovery"}},
          s.recovery);
    m.Set("ckpt_goodput_seconds", {{"job", job}, {"kind", "lost"}}, s.lost);
    m.Set("ckpt_ettr", {{"job", job}}, s.ettr());
  }
}

}  // namespace ckpt::daemon
