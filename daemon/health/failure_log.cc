#include "daemon/health/failure_log.h"

#include <sys/wait.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

FailureLog::FailureLog(Metrics* metrics) : metrics_(metrics) {
  metrics_->Declare(
      "ckpt_failures_total", Metrics::Type::kCounter,
      "failures seen, by cause: trainer_exited, trainer_hung, daemon_restart, "
      "node_lost, disk_error, peer_unreachable, sdc_suspected, "
      "operator_rollback (a job's failures before it saves again are one)");
}

void FailureLog::Failed(const std::string& job, const std::string& cause,
                        const std::string& detail, bool incident, absl::Time at,
                        int rank, absl::Time since) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  if (incident && j.open) return;  // part of the open incident
  // Part of an incident recovered since (seen late: a trainer's exit is
  // looked at after its session closed).
  if (incident && PartOfLastIncident(j, at, since)) return;
  metrics_->Add("ckpt_failures_total", {{"job", job}, {"cause", cause}});
  proto::FailureRecord& r = j.timeline.emplace_back();
  r.set_job(job);
  r.set_cause(cause);
  r.set_detail(detail);
  r.set_unix_micros(absl::ToUnixMicros(at));
  r.set_step(j.last_step);
  if (rank >= 0) r.set_rank(static_cast<uint32_t>(rank));
  if (incident) {
    j.open = true;
    j.rank = rank;
  }
  while (j.timeline.size() > kKept) j.timeline.pop_front();
}

bool FailureLog::PartOfLastIncident(const Job& j, absl::Time at,
                                    absl::Time since) {
  for (auto r = j.timeline.rbegin(); r != j.timeline.rend(); ++r) {
    if (r->recovered_unix_micros() == 0) continue;
    const absl::Time began = absl::FromUnixMicros(r->unix_micros());
    const absl::Time recovered =
        absl::FromUnixMicros(r->recovered_unix_micros());
    return (began <= at && at <= recovered) ||
           (since <= began && at <= recovered + kLateExit);
  }
  return false;
}

void FailureLog::Saved(const std::string& job, uint64_t step, uint32_t rank,
                       absl::Time at) {
  absl::MutexLock lock(&mu_);
  Job& j = jobs_[job];
  j.last_step = std::max(j.last_step, step);
  if (!j.open || (j.rank >= 0 && static_cast<uint32_t>(j.rank) != rank)) return;
  j.open = false;
  for (auto r = j.timeline.rbegin(); r != j.timeline.rend(); ++r) {
    if (r->recovered_unix_micros() != 0) break;
    r->set_recovered_unix_micros(absl::ToUnixMicros(at));
  }
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

std::string TrainerExit(uint32_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  if (!in || !std::getline(in, stat)) return "exited";  // reaped: gone
  // Fields after the command (which may hold spaces): state is the first,
  // exit_code (Linux 3.5+) the 50th.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return "exited";
  std::istringstream fields(stat.substr(close + 2));
  std::vector<std::string> f;
  for (std::string s; fields >> s;) f.push_back(s);
  if (f.empty() || f[0] != "Z") return "";  // still running
  if (f.size() < 50) return "exited";
  const int status = std::atoi(f[49].c_str());
  if (WIFSIGNALED(status))
    return absl::StrCat("killed by signal ", WTERMSIG(status));
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  return "";
}

}  // namespace ckpt::daemon
