// ckpt status: the running ckptd's health, jobs and figures.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/daemon_admin.h"
#include "daemon/api/data_dir_reader.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"
#include "tools/metrics_text.h"

namespace ckpt::cli {

// The figures of ckptd's metrics for one job (what /metrics exports), as
// JSON: saves and their stall, persist throughput, compression, commit
// latency, work at risk, failures and recoveries, the checkpoint interval in
// use and the one Young/Daly suggests, restores.
nlohmann::json JobFigures(const std::vector<ckpt::tools::Sample>& m,
                          const std::string& job) {
  using ckpt::tools::SumOf;
  const std::map<std::string, std::string> j = {{"job", job}};
  auto get = [&](const std::string& name,
                 std::map<std::string, std::string> labels = {}) {
    labels.insert(j.begin(), j.end());
    return SumOf(m, name, labels);
  };
  auto mean = [&](const std::string& histogram,
                  std::map<std::string, std::string> labels = {})
      -> std::optional<double> {
    auto sum = get(histogram + "_sum", labels);
    auto count = get(histogram + "_count", labels);
    if (!sum || !count || *count == 0) return std::nullopt;
    return *sum / *count;
  };
  nlohmann::json f;
  auto put = [&f](const std::string& key, std::optional<double> v) {
    if (v.has_value()) f[key] = *v;
  };
  put("saves", get("ckpt_staging_seconds_count"));
  put("stall_mean_s", mean("ckpt_staging_seconds"));
  put("saves_skipped", get("ckpt_steps_skipped_total"));
  put("persist_failures", get("ckpt_persist_failures_total"));
  auto persisted = get("ckpt_persisted_bytes_total");
  auto persist_s = get("ckpt_persist_seconds_sum");
  if (persisted && persist_s && *persist_s > 0) {
    f["persist_bytes_per_s"] = *persisted / *persist_s;
  }
  put("compression_ratio", get("ckpt_compression_ratio"));
  put("replicated_bytes", get("ckpt_replicated_bytes_total"));
  put("replication_failures", get("ckpt_replication_failures_total"));
  put("fetched_from_peers_bytes", get("ckpt_peer_fetched_bytes_total"));
  put("shared_bytes", get("ckpt_shared_bytes_total"));
  // The erasure-coded peer tier (--peer-redundancy): contributions sent and
  // files rebuilt by this node, and their throughput.
  auto rate = [&](const char* key, const char* bytes, const char* seconds) {
    auto b = get(bytes);
    auto s = get(seconds);
    if (b && s && *s > 0) f[key] = *b / *s;
  };
  put("parity_sent_bytes", get("ckpt_parity_sent_bytes_total"));
  rate("parity_encode_bytes_per_s", "ckpt_parity_sent_bytes_total",
       "ckpt_parity_encode_seconds_total");
  put("parity_rebuilt_bytes", get("ckpt_parity_rebuilt_bytes_total"));
  rate("parity_decode_bytes_per_s", "ckpt_parity_rebuilt_bytes_total",
       "ckpt_parity_rebuild_seconds_total");
  put("parity_reprotected_shards", get("ckpt_parity_reprotected_total"));
  put("parity_stand_in_shards", get("ckpt_parity_stand_in_shards_total"));
  for (const char* tier : {"memory", "peer", "local_disk", "shared"}) {
    put(absl::StrCat("commit_latency_mean_s_", tier),
        mean("ckpt_commit_latency_seconds", {{"tier", tier}}));
    put(absl::StrCat("last_commit_age_s_", tier),
        get("ckpt_last_commit_age_seconds", {{"tier", tier}}));
    put(absl::StrCat("last_committed_step_", tier),
        get("ckpt_last_committed_step", {{"tier", tier}}));
    put(absl::StrCat("restores_from_", tier),
        get("ckpt_restores_total", {{"source", tier}}));
  }
  for (const char* kind : {"job_restart", "daemon_restart"}) {
    put(absl::StrCat("failures_", kind),
        get("ckpt_failures_detected_total", {{"kind", kind}}));
  }
  put("recoveries", get("ckpt_recoveries_total"));
  put("recovery_mean_s", mean("ckpt_recovery_seconds"));
  put("checksum_mismatches", get("ckpt_checksum_mismatches_total"));
  put("trainers_attached", get("ckpt_trainers_attached"));
  for (const char* reason :
       {"idle_job", "older_step", "newest_step", "idle_ttl", "operator"}) {
    put(absl::StrCat("memory_evictions_", reason),
        get("ckpt_memory_evictions_total", {{"reason", reason}}));
  }
  put("restore_fallbacks", get("ckpt_restore_fallbacks_total"));
  put("save_interval_s", get("ckpt_save_interval_seconds"));
  put("save_cost_s", get("ckpt_save_cost_seconds"));
  put("mtbf_s", get("ckpt_mtbf_seconds"));
  put("young_daly_interval_s", get("ckpt_young_daly_interval_seconds"));
  put("save_lag_mean_s", mean("ckpt_save_lag_seconds"));
  // The job's wall time split (daemon/health/goodput.h), beside the interval.
  double wall = 0;
  for (const char* kind : {"training", "stall", "recovery", "lost"}) {
    auto v = get("ckpt_goodput_seconds", {{"kind", kind}});
    if (!v.has_value()) continue;
    f["goodput"][absl::StrCat(kind, "_s")] = *v;
    wall += *v;
  }
  if (f.contains("goodput")) {
    f["goodput"]["wall_s"] = wall;
    put("ettr", get("ckpt_ettr"));
  }
  for (const char* cause : {"trainer_exited", "trainer_hung", "daemon_restart",
                            "node_lost", "disk_error", "peer_unreachable",
                            "sdc_suspected", "operator_rollback"}) {
    auto n = get("ckpt_failures_total", {{"cause", cause}});
    if (n.has_value() && *n > 0) f["failures_by_cause"][cause] = *n;
  }
  // Ranks flagged as stragglers (a mean lag while flagged, 0 after).
  for (const ckpt::tools::Sample& s : m) {
    if (s.name != "ckpt_straggler_lag_seconds" || s.value <= 0) continue;
    auto label = [&s](const char* key) {
      auto it = s.labels.find(key);
      return it == s.labels.end() ? std::string() : it->second;
    };
    if (label("job") != job) continue;
    nlohmann::json sj;
    sj["rank"] = std::stoul(label("rank"));
    sj["node"] = label("node");
    sj["mean_lag_s"] = s.value;
    f["stragglers"].push_back(std::move(sj));
  }
  return f;
}

int Status(const std::string& data_dir, const std::string& socket_path,
           bool json) {
  nlohmann::json j;
  j["data_dir"] = data_dir;
  j["socket"] = socket_path;
  j["daemon_accepting"] = Accepting(socket_path);
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("status", view.status());
  auto jobs = (*view)->Jobs();
  if (!jobs.ok()) return Fail("status", jobs.status());
  ckpt::io::FileSystem* fs = ckpt::io::DefaultFileSystem();
  uint64_t memory = 0, disk = 0;
  int staging = 0, staged = 0, failed = 0;
  j["jobs"] = nlohmann::json::array();
  // Per job, its steps whose replicas disagree (from ckptd).
  std::map<std::string, std::vector<proto::ReplicaCheck>> suspect_steps;
  for (const proto::JobRecord& job : *jobs) {
    auto shards = (*view)->Shards(job.job());
    auto commits = (*view)->Commits(job.job());
    if (!shards.ok()) return Fail("status", shards.status());
    if (!commits.ok()) return Fail("status", commits.status());
    for (const proto::ShardRecord& r : *shards) {
      if (!r.slot_path().empty()) memory += r.slot_bytes();
      if (!r.shard_path().empty()) {
        auto size = fs->FileSize(r.shard_path());
        if (size.ok()) disk += *size;
      }
      staging += r.state() == proto::SHARD_STAGING;
      staged += r.state() == proto::SHARD_STAGED;
      failed += r.state() == proto::SHARD_FAILED;
    }
    nlohmann::json jj;
    jj["job"] = job.job();
    jj["world_size"] = job.world_size();
    for (const proto::CommitRecord& c : *commits) {  // by step: last wins
      nlohmann::json cj;
      cj["step"] = c.step();
      cj["committed_unix_micros"] = c.committed_unix_micros();
      jj["latest"][ckpt::daemon::api::TierName(c.tier())] = cj;
    }
    if (j["daemon_accepting"].get<bool>()) {
      auto suspects = DaemonSuspects(socket_path, job.job());
      if (!suspects.ok()) return Fail("status", suspects.status());
      for (const proto::ReplicaCheck& c : *suspects)
        jj["suspect_steps"].push_back(SuspectJson(c));
      suspect_steps[job.job()] = *std::move(suspects);
      auto failures = DaemonFailures(socket_path, job.job());
      if (!failures.ok()) return Fail("status", failures.status());
      for (const proto::FailureRecord& r : *failures) {
        nlohmann::json fj;
        fj["cause"] = r.cause();
        fj["detail"] = r.detail();
        fj["unix_micros"] = r.unix_micros();
        fj["step"] = r.step();
        if (r.has_rank()) fj["rank"] = r.rank();
        if (!r.node().empty()) fj["node"] = r.node();
        if (r.recovered_unix_micros() != 0) {
          fj["recovery_s"] =
              (r.recovered_unix_micros() - r.unix_micros()) / 1e6;
        }
        jj["failure_timeline"].push_back(std::move(fj));
      }
    }
    j["jobs"].push_back(std::move(jj));
  }
  j["memory_tier_bytes"] = memory;
  j["disk_tier_bytes"] = disk;
  auto free_space = fs->FreeSpace(data_dir);
  if (free_space.ok()) j["disk_free_bytes"] = *free_space;
  // The running daemon's figures, from its metrics.
  std::vector<ckpt::tools::Sample> metrics;
  if (j["daemon_accepting"].get<bool>()) {
    auto text = ckpt::client::GetMetricsText(socket_path);
    if (text.ok()) metrics = ckpt::tools::ParseMetricsText(*text);
  }
  if (!metrics.empty()) {
    // Jobs this node only serves (replicas, parity, stand-in copies) have
    // figures but no shards here.
    std::set<std::string> listed, served;
    for (const nlohmann::json& jj : j["jobs"]) {
      listed.insert(jj["job"].get<std::string>());
    }
    for (const ckpt::tools::Sample& sample : metrics) {
      auto job = sample.labels.find("job");
      if (job != sample.labels.end() && !listed.count(job->second)) {
        served.insert(job->second);
      }
    }
    for (const std::string& job : served) {
      nlohmann::json jj;
      jj["job"] = job;
      jj["world_size"] = 0;
      jj["peer_only"] = true;
      j["jobs"].push_back(std::move(jj));
    }
    for (nlohmann::json& jj : j["jobs"]) {
      jj["figures"] = JobFigures(metrics, jj["job"].get<std::string>());
    }
    auto put = [&](const char* key, const char* name) {
      auto v = ckpt::tools::SumOf(metrics, name, {});
      if (v.has_value()) j[key] = *v;
    };
    put("memory_budget_bytes", "ckpt_memory_budget_bytes");
    put("disk_budget_bytes", "ckpt_disk_budget_bytes");
    put("parity_held_bytes", "ckpt_parity_bytes");
    put("parity_pending_shards", "ckpt_parity_pending_shards");
  }
  j["shards_being_staged"] = staging;
  j["shards_waiting_to_persist"] = staged;
  j["shards_failed"] = failed;
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("ckptd      %s (%s)\n",
              j["daemon_accepting"].get<bool>() ? "up" : "NOT RUNNING",
              socket_path.c_str());
  std::printf("data       %s\n", data_dir.c_str());
  std::printf(
      "memory     %s in staging slots%s\n", HumanBytes(memory).c_str(),
      j.contains("memory_budget_bytes")
          ? absl::StrCat(" of a ",
                         HumanBytes(j["memory_budget_bytes"].get<double>()),
                         " budget")
                .c_str()
          : "");
  std::printf("disk       %s in shard files, %s free\n",
              HumanBytes(disk).c_str(),
              free_space.ok() ? HumanBytes(*free_space).c_str() : "?");
  std::printf("in flight  %d being staged, %d waiting to persist, %d failed\n",
              staging, staged, failed);
  if (j.contains("parity_held_bytes")) {
    std::printf(
        "parity     %s of parity blocks held for peers, %.0f shard(s) "
        "waiting for their group's parity\n",
        HumanBytes(j["parity_held_bytes"].get<double>()).c_str(),
        j.value("parity_pending_shards", 0.0));
  }
  for (const nlohmann::json& jj : j["jobs"]) {
    std::string latest;
    if (jj.contains("latest")) {
      for (auto& [tier, c] : jj["latest"].items()) {
        absl::StrAppend(&latest, latest.empty() ? "" : ", ", tier, " step ",
                        c["step"].get<uint64_t>(), " (",
                        Age(c["committed_unix_micros"].get<int64_t>()), ")");
      }
    }
    if (jj.value("peer_only", false)) {
      std::printf("job %-20s no shards here; served for peers\n",
                  jj["job"].get<std::string>().c_str());
    } else {
      std::printf("job %-20s world %-5u last commit: %s\n",
                  jj["job"].get<std::string>().c_str(),
                  jj["world_size"].get<uint32_t>(),
                  latest.empty() ? "none" : latest.c_str());
    }
    for (const proto::ReplicaCheck& c : suspect_steps[jj["job"]])
      std::printf("  sdc        %s\n", SuspectLine(c).c_str());
    if (!jj.contains("figures")) continue;
    const nlohmann::json& f = jj["figures"];
    auto num = [&f](const char* key) {
      return f.contains(key) ? f[key].get<double>() : 0.0;
    };
    auto secs = [&](const char* key) {
      return f.contains(key) ? HumanSeconds(f[key].get<double>())
                             : std::string("-");
    };
    std::printf(
        "  saves      %.0f (stall mean %s), %.0f skipped for memory, "
        "%.0f persist failures\n",
        num("saves"), secs("stall_mean_s").c_str(), num("saves_skipped"),
        num("persist_failures"));
    std::printf(
        "  persist    %s/s, compression %.2f stored/raw, commit "
        "latency memory %s, disk %s\n",
        HumanBytes(static_cast<uint64_t>(num("persist_bytes_per_s"))).c_str(),
        num("compression_ratio"), secs("commit_latency_mean_s_memory").c_str(),
        secs("commit_latency_mean_s_local_disk").c_str());
    if (f.contains("replicated_bytes") || f.contains("shared_bytes") ||
        f.contains("fetched_from_peers_bytes")) {
      std::printf(
          "  beyond     %s pushed to peers (%.0f failed pushes), %s fetched "
          "from peers, %s to the shared tier; commit latency peer %s, "
          "shared %s\n",
          HumanBytes(static_cast<uint64_t>(num("replicated_bytes"))).c_str(),
          num("replication_failures"),
          HumanBytes(static_cast<uint64_t>(num("fetched_from_peers_bytes")))
              .c_str(),
          HumanBytes(static_cast<uint64_t>(num("shared_bytes"))).c_str(),
          secs("commit_latency_mean_s_peer").c_str(),
          secs("commit_latency_mean_s_shared").c_str());
    }
    if (f.contains("parity_sent_bytes") || f.contains("parity_rebuilt_bytes")) {
      std::printf(
          "  parity     %s of contributions sent (encode %s/s), %s rebuilt "
          "(decode %s/s); %.0f shard(s) protected again, %.0f rebuilt on "
          "this node as a stand-in\n",
          HumanBytes(static_cast<uint64_t>(num("parity_sent_bytes"))).c_str(),
          HumanBytes(static_cast<uint64_t>(num("parity_encode_bytes_per_s")))
              .c_str(),
          HumanBytes(static_cast<uint64_t>(num("parity_rebuilt_bytes")))
              .c_str(),
          HumanBytes(static_cast<uint64_t>(num("parity_decode_bytes_per_s")))
              .c_str(),
          num("parity_reprotected_shards"), num("parity_stand_in_shards"));
    }
    std::printf(
        "  at risk    %s since the last disk commit, %.0f step(s) "
        "newer in memory only\n",
        secs("last_commit_age_s_local_disk").c_str(),
        std::max(0.0, num("last_committed_step_memory") -
                          num("last_committed_step_local_disk")));
    std::printf(
        "  failures   %.0f job restart(s), %.0f daemon restart(s); "
        "%.0f recoveries, time to recover mean %s\n",
        num("failures_job_restart"), num("failures_daemon_restart"),
        num("recoveries"), secs("recovery_mean_s").c_str());
    std::printf(
        "  interval   %s in use; Young/Daly suggests %s (save cost "
        "%s, MTBF %s)\n",
        secs("save_interval_s").c_str(), secs("young_daly_interval_s").c_str(),
        secs("save_cost_s").c_str(), secs("mtbf_s").c_str());
    if (f.contains("goodput")) {
      const nlohmann::json& g = f["goodput"];
      auto part = [&g](const char* key) {
        return HumanSeconds(g.value(key, 0.0));
      };
      std::printf(
          "  goodput    ETTR %.3f of %s: training %s, stall %s, recovery %s, "
          "lost work %s\n",
          num("ettr"), part("wall_s").c_str(), part("training_s").c_str(),
          part("stall_s").c_str(), part("recovery_s").c_str(),
          part("lost_s").c_str());
    }
    if (f.contains("failures_by_cause")) {
      std::string causes;
      for (auto& [cause, n] : f["failures_by_cause"].items()) {
        absl::StrAppend(&causes, causes.empty() ? "" : ", ", cause, " ",
                        n.get<double>());
      }
      std::printf("  causes     %s\n", causes.c_str());
    }
    if (jj.contains("failure_timeline")) {
      const nlohmann::json& t = jj["failure_timeline"];
      for (size_t i = t.size() > 3 ? t.size() - 3 : 0; i < t.size(); ++i) {
        std::printf(
            "  failure    %s %s: %s; %s\n", Age(t[i]["unix_micros"]).c_str(),
            t[i]["cause"].get<std::string>().c_str(),
            t[i]["detail"].get<std::string>().c_str(),
            t[i].contains("recovery_s")
                ? ("recovered in " + HumanSeconds(t[i]["recovery_s"])).c_str()
                : "not recovered yet");
      }
    }
    if (f.contains("stragglers")) {
      std::string named;
      for (const nlohmann::json& sj : f["stragglers"]) {
        absl::StrAppend(&named, named.empty() ? "" : ", ", "rank ",
                        sj["rank"].get<uint32_t>(), " (node ",
                        sj["node"].get<std::string>(), ") ",
                        HumanSeconds(sj["mean_lag_s"].get<double>()),
                        " behind");
      }
      std::printf("  stragglers %s\n", named.c_str());
    }
    std::string evicted;
    for (const char* reason :
         {"idle_job", "older_step", "newest_step", "idle_ttl", "operator"}) {
      const double n = num(absl::StrCat("memory_evictions_", reason).c_str());
      if (n > 0)
        absl::StrAppend(&evicted, evicted.empty() ? "" : ", ", n, " ", reason);
    }
    std::printf(
        "  memory     %.0f trainer(s) attached; copies dropped "
        "while safe elsewhere: %s\n",
        num("trainers_attached"), evicted.empty() ? "none" : evicted.c_str());
    std::printf(
        "  restores   %.0f from memory, %.0f from disk; %.0f checksum "
        "mismatches, %.0f fallbacks\n",
        num("restores_from_memory"), num("restores_from_local_disk"),
        num("checksum_mismatches"), num("restore_fallbacks"));
  }
  return 0;
}

}  // namespace ckpt::cli
