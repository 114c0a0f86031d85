#include "daemon/health/job_health.h"

#include <algorithm>
#include <cmath>

#include "daemon/coord/coordinator.h"

namespace ckpt::daemon {

JobHealth::JobHealth(Metrics* metrics) : metrics_(metrics) {
  DeclareMetrics();
  metrics_->OnScrape([this](Metrics& m) { Scrape(m); });
}

void JobHealth::DeclareMetrics() {
  using T = Metrics::Type;
  Metrics& m = *metrics_;
  const std::vector<double> seconds = Metrics::SecondsBuckets();
  m.Declare("ckpt_staging_seconds", T::kHistogram,
            "time from BeginStage to StageComplete of a shard: the "
            "trainer's copy into its slot",
            seconds);
  m.Declare("ckpt_commit_latency_seconds", T::kHistogram,
            "time from a step's first BeginStage to its commit at a tier",
            seconds);
  m.Declare("ckpt_last_committed_step", T::kGauge,
            "newest step committed at a tier since ckptd started");
  m.Declare("ckpt_last_commit_age_seconds", T::kGauge,
            "seconds since that commit: the work at risk should the tier be "
            "all that is left");
  m.Declare("ckpt_failures_detected_total", T::kCounter,
            "failures seen: job_restart (rank 0 saved a step again), "
            "daemon_restart (ckptd started with the job's shards)");
  m.Declare("ckpt_recoveries_total", T::kCounter,
            "failures the job came back from: its first save after a job "
            "restart or a daemon restart");
  m.Declare("ckpt_recovery_seconds", T::kHistogram,
            "time to recover: from the job's last save before the failure "
            "to its first save after it",
            {1, 5, 15, 30, 60, 120, 300, 900, 3600});
  m.Declare("ckpt_save_interval_seconds", T::kGauge,
            "the interval between saves in use (moving average)");
  m.Declare("ckpt_save_cost_seconds", T::kGauge,
            "mean staging time per save: what a save costs the trainer");
  m.Declare("ckpt_mtbf_seconds", T::kGauge,
            "observed mean time between failures of the job (once one was "
            "seen)");
  m.Declare("ckpt_young_daly_interval_seconds", T::kGauge,
            "the save interval Young/Daly's formula sqrt(2 * cost * MTBF) "
            "suggests from the measured cost and failure rate");
}

void JobHealth::StagingBegun(const SlotId& id, absl::Time at) {
  absl::MutexLock lock(&mu_);
  begun_[{id.job, id.step, id.rank}] = at;
  first_begun_.emplace(std::make_pair(id.job, id.step), at);  // keeps the first
}

std::vector<uint64_t> JobHealth::Staged(const SlotId& id, absl::Time at) {
  absl::MutexLock lock(&mu_);
  auto b = begun_.find({id.job, id.step, id.rank});
  if (b != begun_.end()) {
    const double seconds = absl::ToDoubleSeconds(at - b->second);
    metrics_->Observe("ckpt_staging_seconds", {{"job", id.job}}, seconds);
    Figures& figures = jobs_[id.job];
    figures.staging_seconds += seconds;
    ++figures.stagings;
    begun_.erase(b);
  }
  std::vector<uint64_t> abandoned;
  for (auto it = begun_.lower_bound({id.job, 0, 0});
       it != begun_.end() && std::get<0>(it->first) == id.job &&
       std::get<1>(it->first) < id.step;) {
    if (std::get<2>(it->first) == id.rank) {
      abandoned.push_back(std::get<1>(it->first));
      it = begun_.erase(it);
    } else {
      ++it;
    }
  }
  return abandoned;
}

void JobHealth::SawSave(const std::string& job, uint64_t step, absl::Time at) {
  absl::MutexLock lock(&mu_);
  Figures& h = jobs_[job];
  if (h.since == absl::InfinitePast()) h.since = at;
  if (h.last_save != absl::InfinitePast()) {
    if (step <= h.last_step) {
      // Rank 0 saves a step it saved before: the job restarted from an
      // earlier checkpoint. Its recovery took from its last save before the
      // failure to this one.
      const Labels kind = {{"job", job}, {"kind", "job_restart"}};
      metrics_->Add("ckpt_failures_detected_total", kind);
      metrics_->Add("ckpt_recoveries_total", kind);
      metrics_->Observe("ckpt_recovery_seconds", kind,
                        absl::ToDoubleSeconds(at - h.last_save));
      ++h.failures;
    } else {
      const double dt = absl::ToDoubleSeconds(at - h.last_save);
      h.interval = h.intervals == 0 ? dt : 0.8 * h.interval + 0.2 * dt;
      ++h.intervals;
    }
  }
  if (h.down_since != absl::InfinitePast()) {
    const Labels kind = {{"job", job}, {"kind", "daemon_restart"}};
    metrics_->Add("ckpt_recoveries_total", kind);
    metrics_->Observe("ckpt_recovery_seconds", kind,
                      absl::ToDoubleSeconds(at - h.down_since));
    h.down_since = absl::InfinitePast();
  }
  h.last_save = at;
  h.last_step = step;
}

void JobHealth::Committed(const std::string& job, uint64_t step,
                          const std::vector<proto::Tier>& tiers,
                          absl::Time at) {
  if (tiers.empty()) return;
  absl::MutexLock lock(&mu_);
  auto first = first_begun_.find({job, step});
  for (proto::Tier tier : tiers) {
    const Labels labels = {{"job", job}, {"tier", TierName(tier)}};
    auto [last, fresh] = last_commit_.try_emplace({job, tier}, step, at);
    if (!fresh) {
      if (last->second.first >= step) continue;  // latest never goes back
      last->second = {step, at};
    }
    metrics_->Set("ckpt_last_committed_step", labels,
                  static_cast<double>(step));
    if (first != first_begun_.end()) {
      metrics_->Observe("ckpt_commit_latency_seconds", labels,
                        absl::ToDoubleSeconds(at - first->second));
    }
  }
  // The first staging of older steps is not needed once a step is on disk.
  if (std::find(tiers.begin(), tiers.end(), proto::TIER_LOCAL_DISK) !=
      tiers.end()) {
    first_begun_.erase(first_begun_.lower_bound({job, 0}),
                       first_begun_.upper_bound({job, step}));
  }
}

void JobHealth::DaemonRestarted(const std::string& job, absl::Time last_save,
                                absl::Time now) {
  absl::MutexLock lock(&mu_);
  metrics_->Add("ckpt_failures_detected_total",
                {{"job", job}, {"kind", "daemon_restart"}});
  Figures& h = jobs_[job];
  h.since = now;
  ++h.failures;
  h.down_since = last_save;
}

void JobHealth::RolledBackTo(const std::string& job, uint64_t step) {
  absl::MutexLock lock(&mu_);
  jobs_[job].last_step = step;
}

JobHealth::Figures JobHealth::Of(const std::string& job) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job);
  return it == jobs_.end() ? Figures{} : it->second;
}

void JobHealth::Scrape(Metrics& m) {
  std::vector<std::pair<std::string, Figures>> jobs;
  std::vector<std::pair<Labels, absl::Time>> commits;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [job, h] : jobs_) jobs.push_back({job, h});
    for (const auto& [key, last] : last_commit_) {
      commits.push_back(
          {{{"job", key.first}, {"tier", TierName(key.second)}}, last.second});
    }
  }
  const absl::Time now = absl::Now();
  for (const auto& [labels, at] : commits) {
    m.Set("ckpt_last_commit_age_seconds", labels,
          absl::ToDoubleSeconds(now - at));
  }
  for (const auto& [job, h] : jobs) {
    const Labels labels = {{"job", job}};
    if (h.intervals > 0)
      m.Set("ckpt_save_interval_seconds", labels, h.interval);
    if (h.stagings == 0) continue;
    const double cost = h.staging_seconds / h.stagings;
    m.Set("ckpt_save_cost_seconds", labels, cost);
    if (h.failures == 0 || h.since == absl::InfinitePast()) continue;
    const double mtbf = absl::ToDoubleSeconds(now - h.since) / h.failures;
    m.Set("ckpt_mtbf_seconds", labels, mtbf);
    m.Set("ckpt_young_daly_interval_seconds", labels,
          std::sqrt(2 * cost * mtbf));
  }
}

}  // namespace ckpt::daemon
