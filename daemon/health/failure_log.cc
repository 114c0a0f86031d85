#include "daemon/health/failure_log.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

FailureLog::FailureLog(Metrics* metrics, Persist persist,
                       OnIncident on_incident)
    : metrics_(metrics),
      persist_(std::move(persist)),
      on_incident_(std::move(on_incident)) {
  metrics_->Declare(
      "ckpt_failures_total", Metrics::Type::kCounter,
      "failures seen, by cause: trainer_exited, trainer_hung, daemon_restart, "
      "node_lost, disk_error, peer_unreachable, sdc_suspected, "
      "operator_rollback (a job's failures before it saves again are one; "
      "a node's loss is counted by one node of the cluster)");
}

void FailureLog::Failed(const std::string& job, const std::string& cause,
                        const std::string& detail, bool incident, absl::Time at,
                        int rank, absl::Time since, absl::Duration unseen) {
  std::optional<proto::FailureHistory> history;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    if (incident && j.open) return;  // part of the open incident
    // Part of an incident recovered since (seen late: a trainer's exit is
    // looked at after its session closed).
    if (incident && PartOfLastIncident(j, at, since)) return;
    Record(job, j, cause, detail, at, rank);
    if (incident) {
      j.open = true;
      j.rank = rank;
    }
    history = HistoryOf(job, j);
  }
  Keep(history);
  if (incident && on_incident_) on_incident_(job, at, rank, unseen);
}

void FailureLog::FailedEpisode(const std::string& job, const std::string& cause,
                               const std::string& detail, absl::Time at,
                               const std::string& node) {
  std::optional<proto::FailureHistory> history;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    if (!j.failing.insert(EpisodeOf(cause, node)).second) return;  // the same
    Record(job, j, cause, detail, at, -1).set_node(node);
    history = HistoryOf(job, j);
  }
  Keep(history);
}

void FailureLog::Healed(const std::string& job, const std::string& cause,
                        absl::Time at, const std::string& node) {
  std::vector<proto::FailureHistory> histories;
  {
    absl::MutexLock lock(&mu_);
    // (Called after every replica push: one job is looked up, not scanned.)
    auto heal = [&](const std::string& name, Job& j) {
      if (Heal(j, cause, node, at)) histories.push_back(HistoryOf(name, j));
    };
    if (job.empty()) {
      for (auto& [name, j] : jobs_) heal(name, j);
    } else if (auto it = jobs_.find(job); it != jobs_.end()) {
      heal(job, it->second);
    }
  }
  for (const proto::FailureHistory& h : histories) Keep(h);
}

std::string FailureLog::EpisodeOf(const std::string& cause,
                                  const std::string& node) {
  return node.empty() ? cause : absl::StrCat(cause, "@", node);
}

bool FailureLog::Heal(Job& j, const std::string& cause, const std::string& node,
                      absl::Time at) {
  if (j.failing.erase(EpisodeOf(cause, node)) == 0) return false;
  for (auto r = j.timeline.rbegin(); r != j.timeline.rend(); ++r) {
    if (r->cause() != cause || r->node() != node) continue;
    if (r->recovered_unix_micros() == 0)
      r->set_recovered_unix_micros(absl::ToUnixMicros(at));
    break;
  }
  return true;
}

proto::FailureRecord& FailureLog::Record(const std::string& job, Job& j,
                                         const std::string& cause,
                                         const std::string& detail,
                                         absl::Time at, int rank) {
  metrics_->Add("ckpt_failures_total", {{"job", job}, {"cause", cause}});
  ++j.counts[cause];
  proto::FailureRecord& r = j.timeline.emplace_back();
  r.set_job(job);
  r.set_cause(cause);
  r.set_detail(detail);
  r.set_unix_micros(absl::ToUnixMicros(at));
  r.set_step(j.last_step);
  if (rank >= 0) r.set_rank(static_cast<uint32_t>(rank));
  while (j.timeline.size() > kKept) j.timeline.pop_front();
  return j.timeline.back();
}

proto::FailureHistory FailureLog::HistoryOf(const std::string& job,
                                            const Job& j) {
  proto::FailureHistory h;
  h.set_job(job);
  for (const proto::FailureRecord& r : j.timeline) *h.add_timeline() = r;
  for (const auto& [cause, n] : j.counts) (*h.mutable_counts())[cause] = n;
  h.set_open(j.open);
  h.set_open_rank(j.rank);
  h.set_last_step(j.last_step);
  for (const std::string& cause : j.failing) h.add_failing(cause);
  return h;
}

void FailureLog::Keep(const std::optional<proto::FailureHistory>& history) {
  if (history.has_value() && persist_) persist_(*history);
}

void FailureLog::Restore(const proto::FailureHistory& history) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[history.job()];
  j.timeline.assign(history.timeline().begin(), history.timeline().end());
  // An incident open when ckptd went down ends with it: the restart is
  // another (and the kept state may be older than the last change).
  j.open = false;
  j.rank = -1;
  j.last_step = history.last_step();
  j.failing = {history.failing().begin(), history.failing().end()};
  for (const auto& [cause, n] : history.counts()) {
    j.counts[cause] = n;
    metrics_->Add("ckpt_failures_total",
                  {{"job", history.job()}, {"cause", cause}},
                  static_cast<double>(n));
  }
}

bool FailureLog::PartOfLastIncident(const Job& j, absl::Time at,
                                    absl::Time since) {
  for (auto r = j.timeline.rbegin(); r != j.timeline.rend(); ++r) {
    if (r->recovered_unix_micros() == 0) continue;
    // The newest recovered incident: the records recovered at that moment.
    const absl::Time recovered =
        absl::FromUnixMicros(r->recovered_unix_micros());
    absl::Time began = absl::FromUnixMicros(r->unix_micros());
    bool exits = false;
    for (auto q = r; q != j.timeline.rend() &&
                     q->recovered_unix_micros() == r->recovered_unix_micros();
         ++q) {
      began = std::min(began, absl::FromUnixMicros(q->unix_micros()));
      exits = exits || q->cause() == "trainer_exited";
    }
    // A trainer that went down with a job that restarted (its peers' exits
    // opened the incident), noticed late; not one that lived through a hang
    // or a daemon restart.
    return (began <= at && at <= recovered) ||
           (exits && since <= began && at <= recovered + kLateExit);
  }
  return false;
}

void FailureLog::Saved(const std::string& job, uint64_t step, uint32_t rank,
                       absl::Time at) {
  std::optional<proto::FailureHistory> history;
  {
    absl::MutexLock lock(&mu_);
    Job& j = jobs_[job];
    j.last_step = std::max(j.last_step, step);
    if (!j.open || (j.rank >= 0 && static_cast<uint32_t>(j.rank) != rank))
      return;
    j.open = false;
    for (auto r = j.timeline.rbegin(); r != j.timeline.rend(); ++r) {
      if (r->recovered_unix_micros() != 0) break;
      r->set_recovered_unix_micros(absl::ToUnixMicros(at));
    }
    history = HistoryOf(job, j);
  }
  Keep(history);
}

std::vector<proto::FailureRecord> FailureLog::Timeline(
    const std::string& job) const {
  absl::MutexLock lock(&mu_);
  std::vector<proto::FailureRecord> out;
  for (const auto& [name, j] : jobs_) {
    if (!job.empty() && name != job) continue;
    out.insert(out.end(), j.timeline.begin(), j.timeline.end());
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& a, const auto& b) {
    return a.unix_micros() < b.unix_micros();
  });
  return out;
}

namespace {

// The fields of /proc/<pid>/stat after the command (which may hold spaces):
// the state is the first.
std::vector<std::string> StatFields(uint32_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!in || !std::getline(in, stat)) return {};
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 > stat.size()) return {};
  std::istringstream fields(stat.substr(close + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  return f;
}

}  // namespace

std::optional<absl::Time> ProcessStart(uint32_t pid) {
  const std::vector<std::string> f = StatFields(pid);
  std::ifstream uptime_file("/proc/uptime");
  double uptime = 0;
  // starttime, in clock ticks after boot, is the 20th field after the
  // command.
  if (f.size() < 20 || !(uptime_file >> uptime)) return std::nullopt;
  const double started = std::atof(f[19].c_str()) / ::sysconf(_SC_CLK_TCK);
  if (started > uptime) return std::nullopt;
  return absl::Now() - absl::Seconds(uptime - started);
}

std::string TrainerExit(uint32_t pid) {
  // Gone (reaped) when there is nothing to read; exit_code (Linux 3.5+) is
  // the 50th field after the command.
  const std::vector<std::string> f = StatFields(pid);
  if (f.empty()) return "exited";
  if (f[0] != "Z") return "";  // still running
  if (f.size() < 50) return "exited";
  const int status = std::atoi(f[49].c_str());
  if (WIFSIGNALED(status))
    return absl::StrCat("killed by signal ", WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  return "";
}

}  // namespace ckpt::daemon
