// ckpt gc: retention through the running ckptd, or its memory tier.

#include <cstdio>
#include <iostream>
#include <string>

#include "client/daemon_admin.h"
#include "daemon/api/data_dir_reader.h"
#include "nlohmann/json.hpp"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

int GcMemory(const std::string& socket_path, const std::string& job,
             bool dry_run, bool json) {
  if (!Accepting(socket_path)) {
    std::cerr << "ckpt gc: no ckptd accepts on " << socket_path
              << "; memory-tier copies belong to the running daemon\n";
    return kExitProblems;
  }
  proto::CollectGarbageRequest req;
  req.set_job(job);
  req.set_memory(true);
  req.set_dry_run(dry_run);
  auto resp = ckpt::client::CollectGarbage(socket_path, req);
  if (!resp.ok()) return Fail("gc", resp.status());
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["dry_run"] = dry_run;
    j["dropped"] = nlohmann::json::array();
    for (const proto::DroppedCopy& d : resp->dropped()) {
      j["dropped"].push_back({{"step", d.step()},
                              {"rank", d.rank()},
                              {"slot_path", d.slot_path()}});
    }
    j["kept"] = nlohmann::json::array();
    for (const proto::KeptCopy& k : resp->kept()) {
      j["kept"].push_back(
          {{"step", k.step()}, {"rank", k.rank()}, {"reason", k.reason()}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const char* verb = dry_run ? "would drop" : "dropped";
  for (const proto::DroppedCopy& d : resp->dropped()) {
    std::printf("%s step %lu rank %u: memory\n", verb,
                static_cast<unsigned long>(d.step()), d.rank());
  }
  for (const proto::KeptCopy& k : resp->kept()) {
    std::printf("kept step %lu rank %u in memory: %s\n",
                static_cast<unsigned long>(k.step()), k.rank(),
                k.reason().c_str());
  }
  std::printf("job %s: %s %d memory-tier cop%s, kept %d\n", job.c_str(), verb,
              resp->dropped_size(), resp->dropped_size() == 1 ? "y" : "ies",
              resp->kept_size());
  return 0;
}

int Gc(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, int keep, int keep_memory, bool dry_run,
       bool json) {
  if (keep < 1 || keep_memory < 0) {
    std::cerr << "ckpt gc: --keep must be at least 1 (the latest committed "
                 "step is never deleted)\n";
    return kExitUsage;
  }
  proto::CollectGarbageResponse dropped;
  const bool daemon_up = Accepting(socket_path);
  if (daemon_up) {
    proto::CollectGarbageRequest req;
    req.set_job(job);
    req.set_keep_disk(keep);
    req.set_keep_memory(keep_memory);
    req.set_dry_run(dry_run);
    auto resp = ckpt::client::CollectGarbage(socket_path, req);
    if (!resp.ok()) return Fail("gc", resp.status());
    dropped = *std::move(resp);
  } else if (dry_run) {
    auto view = ckpt::tools::DataDirView::Open(data_dir);
    if (!view.ok()) return Fail("gc", view.status());
    auto shards = (*view)->Shards(job);
    auto commits = (*view)->Commits(job);
    if (!shards.ok()) return Fail("gc", shards.status());
    if (!commits.ok()) return Fail("gc", commits.status());
    for (proto::DroppedCopy& d : ckpt::daemon::api::PlanCollection(
             *commits, *shards, keep, keep_memory == 0 ? 1 : keep_memory)) {
      *dropped.add_dropped() = std::move(d);
    }
  } else {
    std::cerr << "ckpt gc: no ckptd accepts on " << socket_path
              << "; the daemon owns the catalog, so start it (or pass "
                 "--socket), or use --dry-run to see what would go\n";
    return kExitProblems;
  }
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["dry_run"] = dry_run;
    j["dropped"] = nlohmann::json::array();
    for (const proto::DroppedCopy& d : dropped.dropped()) {
      j["dropped"].push_back({{"step", d.step()},
                              {"rank", d.rank()},
                              {"shard_path", d.shard_path()},
                              {"slot_path", d.slot_path()},
                              {"forgotten", d.forgotten()}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const char* verb = dry_run ? "would drop" : "dropped";
  for (const proto::DroppedCopy& d : dropped.dropped()) {
    std::printf("%s step %lu rank %u:%s%s%s\n", verb,
                static_cast<unsigned long>(d.step()), d.rank(),
                d.shard_path().empty() ? "" : " disk",
                d.slot_path().empty() ? "" : " memory",
                d.forgotten() ? " (nothing left of it)" : "");
  }
  std::printf(
      "job %s: %s %d shard cop%s%s\n", job.c_str(), verb,
      dropped.dropped_size(), dropped.dropped_size() == 1 ? "y" : "ies",
      !daemon_up ? " (planned from the catalog; ckptd is not running)" : "");
  return 0;
}

}  // namespace ckpt::cli
