// ckpt ls: jobs, or a job's steps with their state per tier.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/api/data_dir_reader.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

int Ls(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, bool json) {
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("ls", view.status());
  std::vector<std::string> jobs;
  if (job.empty()) {
    auto records = (*view)->Jobs();
    if (!records.ok()) return Fail("ls", records.status());
    for (const proto::JobRecord& r : *records) jobs.push_back(r.job());
  } else {
    auto record = (*view)->Job(job);
    if (!record.ok()) return Fail("ls", record.status());
    jobs.push_back(job);
  }
  nlohmann::json out = nlohmann::json::array();
  bool from_daemon = true;
  for (const std::string& name : jobs) {
    auto commits = DaemonCommits(socket_path, name);
    if (!commits.ok()) return Fail("ls", commits.status());
    from_daemon = commits->has_value();
    auto steps = (*view)->Steps(name, from_daemon ? &**commits : nullptr);
    if (!steps.ok()) return Fail("ls", steps.status());
    auto suspects = from_daemon ? DaemonSuspects(socket_path, name)
                                : std::vector<proto::ReplicaCheck>();
    if (!suspects.ok()) return Fail("ls", suspects.status());
    std::map<uint64_t, const proto::ReplicaCheck*> suspect;
    for (const proto::ReplicaCheck& c : *suspects) suspect[c.step()] = &c;
    nlohmann::json j;
    j["job"] = name;
    j["commits_from"] = from_daemon ? "ckptd" : "data_dir";
    j["steps"] = nlohmann::json::array();
    for (const auto& s : *steps) {
      nlohmann::json sj = StepJson(s);
      if (suspect.count(s.step)) sj["suspect"] = SuspectJson(*suspect[s.step]);
      j["steps"].push_back(std::move(sj));
    }
    if (json) {
      out.push_back(std::move(j));
      continue;
    }
    if (job.empty()) {
      // One line per job: how many steps, the newest committed per tier.
      std::map<proto::Tier, uint64_t> latest;
      uint32_t world = 0;
      for (const auto& s : *steps) {
        world = std::max(world, s.world_size);
        for (proto::Tier t : s.committed) latest[t] = s.step;
      }
      std::vector<std::string> cells;
      for (proto::Tier t : kLsTiers) {
        auto it = latest.find(t);
        if (it == latest.end() &&
            (t == proto::TIER_PEER || t == proto::TIER_SHARED)) {
          continue;  // a tier this job does not use
        }
        cells.push_back(absl::StrCat(
            ckpt::daemon::api::TierName(t) == "local_disk"
                ? "disk"
                : ckpt::daemon::api::TierName(t),
            " ", it == latest.end() ? "-" : absl::StrCat(it->second)));
      }
      std::printf("%-24s world %-5u %4zu steps  latest committed: %s\n",
                  name.c_str(), world, steps->size(),
                  absl::StrJoin(cells, ", ").c_str());
      continue;
    }
    std::printf("job %s (%s)\n", name.c_str(), data_dir.c_str());
    std::printf("  %10s %6s %-10s %-10s %-10s %-10s %-7s %10s %10s  %s\n",
                "step", "world", "memory", "peer", "disk", "shared", "failed",
                "raw", "stored", "age");
    for (const auto& s : *steps) {
      std::printf(
          "  %10lu %6u %-10s %-10s %-10s %-10s %-7s %10s %10s  %s\n",
          static_cast<unsigned long>(s.step), s.world_size,
          TierCell(s, proto::TIER_MEMORY, s.ranks_in_memory).c_str(),
          TierCell(s, proto::TIER_PEER, s.ranks_on_peers).c_str(),
          TierCell(s, proto::TIER_LOCAL_DISK, s.ranks_on_disk).c_str(),
          TierCell(s, proto::TIER_SHARED, 0).c_str(),
          s.ranks_failed == 0 ? "-" : absl::StrCat(s.ranks_failed).c_str(),
          s.ranks_on_disk ? HumanBytes(s.raw_bytes).c_str() : "-",
          s.ranks_on_disk ? HumanBytes(s.stored_bytes).c_str() : "-",
          Age(s.newest_unix_micros).c_str());
    }
    for (const proto::ReplicaCheck& c : *suspects)
      std::printf("  %s\n", SuspectLine(c).c_str());
  }
  if (!json && !jobs.empty()) {
    std::printf(
        from_daemon
            ? "(commits: ckptd's coordinator, via %s; ranks k/N: this node's "
              "shards)\n"
            : "(commits: the data directory's records, ckptd not reachable at "
              "%s; a node on etcd keeps its commits there, not here)\n",
        socket_path.c_str());
  }
  if (json) std::cout << (job.empty() ? out : out[0]).dump(2) << "\n";
  return 0;
}

}  // namespace ckpt::cli
