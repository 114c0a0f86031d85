// ckpt restore-plan and restore: where a step's copies are, and making a step
// what a job resumes from.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/daemon_admin.h"
#include "daemon/api/data_dir_reader.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/box.h"
#include "snapshot/dtype.h"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

int RestorePlan(const std::string& data_dir, const std::string& socket_path,
                const std::string& job, const std::string& step_text,
                uint32_t world, int split_dim, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("restore-plan", step.status());
  if (world == 0) {
    std::cerr << "ckpt restore-plan: --world must be at least 1\n";
    return kExitUsage;
  }
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("restore-plan", view.status());
  auto shards = (*view)->StepShards(job, *step);
  // A node of a cluster knows its own shards; the daemon, when it runs, finds
  // the others' (peers, shared tier) and the step's world size.
  auto commits = DaemonCommits(socket_path, job);
  if (!commits.ok()) return Fail("restore-plan", commits.status());
  uint32_t saved_world = 0;
  if (commits->has_value()) {
    for (const proto::CommitRecord& c : **commits) {
      if (c.step() == *step) saved_world = c.world_size();
    }
  }
  if (!shards.ok() &&
      (!absl::IsNotFound(shards.status()) || saved_world == 0)) {
    return Fail("restore-plan", shards.status());
  }
  if (!shards.ok()) shards = std::vector<proto::ShardRecord>();
  ckpt::io::FileSystem* fs = ckpt::io::DefaultFileSystem();
  auto exists = [fs](const std::string& p) {
    auto e = fs->Exists(p);
    return !p.empty() && e.ok() && *e;
  };
  // Tensors by name: their global shape, dtype and the saved pieces.
  struct Saved {
    uint32_t rank;
    ckpt::snapshot::Box box;
    std::string source, path;
  };
  std::map<std::string, std::pair<proto::Item, std::vector<Saved>>> tensors;
  auto add_pieces = [&](uint32_t rank, const proto::Item& item,
                        const std::string& source, const std::string& path) {
    if (item.kind() != proto::ITEM_KIND_TENSOR) return;
    auto& t = tensors[item.name()];
    t.first = item;
    t.second.push_back({rank,
                        {{item.box_offset().begin(), item.box_offset().end()},
                         {item.box_length().begin(), item.box_length().end()}},
                        source,
                        path});
  };
  std::set<uint32_t> here;
  for (const proto::ShardRecord& r : *shards) {
    std::string source, path;
    if (r.state() == proto::SHARD_STAGING || r.state() == proto::SHARD_FAILED) {
      // not restorable
    } else if (exists(r.slot_path())) {
      source = "memory", path = r.slot_path();
    } else if (r.state() == proto::SHARD_PERSISTED && exists(r.shard_path())) {
      source = "local_disk", path = r.shard_path();
    }
    if (!source.empty()) here.insert(r.rank());
    if (saved_world == 0) saved_world = r.world_size();
    for (const proto::StagedItem& s : r.items()) {
      add_pieces(r.rank(), s.item(), source, path);
    }
  }
  // The saved ranks this node has no copy of: where the daemon would fetch
  // them from, without fetching.
  int unlocated = 0;
  for (uint32_t rank = 0; commits->has_value() && rank < saved_world; ++rank) {
    if (here.count(rank) > 0) continue;
    proto::FindShardRequest req;
    req.mutable_shard()->set_job(job);
    req.mutable_shard()->set_step(*step);
    req.mutable_shard()->set_rank(rank);
    auto found = ckpt::client::CallDaemon<proto::FindShardRequest,
                                          proto::FindShardResponse>(
        socket_path, &proto::CkptDaemon::Stub::FindShard, req,
        absl::StrCat("finding rank ", rank, "'s shard"),
        std::chrono::seconds(30));
    if (!found.ok()) {
      if (!absl::IsNotFound(found.status())) {
        return Fail("restore-plan", found.status());
      }
      ++unlocated;
      continue;
    }
    const proto::ShardSource& best = found->sources(0);
    std::string source;
    if (best.tier() == proto::TIER_PEER) {
      source = best.here() ? "replica_here" : "peer_memory";
    } else if (best.tier() == proto::TIER_LOCAL_DISK && !best.here()) {
      source = "peer_disk";
    }
    if (source.empty()) source = ckpt::daemon::api::TierName(best.tier());
    if (!best.node().empty() && !best.here()) {
      absl::StrAppend(&source, "@", best.node());
    }
    for (const proto::Item& item : found->items()) {
      add_pieces(rank, item, source, best.path());
    }
  }
  nlohmann::json out;
  out["job"] = job;
  out["step"] = *step;
  out["world"] = world;
  out["ranks"] = nlohmann::json::array();
  int missing = 0;
  for (uint32_t rank = 0; rank < world; ++rank) {
    nlohmann::json rj;
    rj["rank"] = rank;
    rj["tensors"] = nlohmann::json::array();
    for (const auto& [name, t] : tensors) {
      const proto::Item& item = t.first;
      std::vector<int64_t> shape(item.global_shape().begin(),
                                 item.global_shape().end());
      ckpt::snapshot::Box want{std::vector<int64_t>(shape.size(), 0), shape};
      if (!shape.empty()) {
        const size_t d = std::min<size_t>(split_dim, shape.size() - 1);
        want.offset[d] = shape[d] * rank / world;
        want.length[d] = shape[d] * (rank + 1) / world - want.offset[d];
      }
      nlohmann::json tj;
      tj["name"] = name;
      tj["box_offset"] = want.offset;
      tj["box_length"] = want.length;
      tj["pieces"] = nlohmann::json::array();
      int64_t covered = 0;
      for (const Saved& piece : t.second) {
        const int64_t n = ckpt::snapshot::Intersect(piece.box, want).elements();
        if (n == 0) continue;
        nlohmann::json pj;
        pj["saved_rank"] = piece.rank;
        pj["elements"] = n;
        pj["bytes"] = n * ckpt::snapshot::DTypeSize(item.dtype());
        pj["source"] = piece.source.empty() ? "none" : piece.source;
        if (!piece.path.empty()) pj["path"] = piece.path;
        if (!piece.source.empty()) covered += n;
        tj["pieces"].push_back(std::move(pj));
      }
      tj["missing_elements"] = want.elements() - covered;
      if (want.elements() != covered) ++missing;
      rj["tensors"].push_back(std::move(tj));
    }
    out["ranks"].push_back(std::move(rj));
  }
  out["complete"] = missing == 0;
  out["saved_world"] = saved_world;
  out["ranks_without_a_copy"] = unlocated;
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "restore of job %s step %lu onto %u ranks (split along dim %d)\n",
        job.c_str(), static_cast<unsigned long>(*step), world, split_dim);
    for (const nlohmann::json& rj : out["ranks"]) {
      std::printf("  rank %u\n", rj["rank"].get<uint32_t>());
      for (const nlohmann::json& tj : rj["tensors"]) {
        std::string pieces;
        for (const nlohmann::json& pj : tj["pieces"]) {
          absl::StrAppend(&pieces, pieces.empty() ? "" : ", ", "r",
                          pj["saved_rank"].get<uint32_t>(), " ",
                          pj["source"].get<std::string>(), " ",
                          HumanBytes(pj["bytes"].get<uint64_t>()));
        }
        std::printf(
            "    %-32s %s+%s <- %s%s\n", tj["name"].get<std::string>().c_str(),
            tj["box_offset"].dump().c_str(), tj["box_length"].dump().c_str(),
            pieces.empty() ? "nothing" : pieces.c_str(),
            tj["missing_elements"].get<int64_t>() > 0
                ? absl::StrCat("  MISSING ",
                               tj["missing_elements"].get<int64_t>(),
                               " elements")
                      .c_str()
                : "");
      }
    }
    if (unlocated > 0)
      std::printf("%d of the %u saved ranks have no copy anywhere\n", unlocated,
                  saved_world);
    if (missing > 0)
      std::printf("%d tensor box(es) cannot be restored\n", missing);
  }
  return missing == 0 ? 0 : kExitProblems;
}

int Restore(const std::string& data_dir, const std::string& socket_path,
            const std::string& job, const std::string& step_text,
            const std::string& into, bool discard_newer, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("restore", step.status());
  if (!into.empty() && discard_newer) {
    return UsageError("restore", absl::InvalidArgumentError(
                                     "--discard-newer is for an in-place "
                                     "restore, not for --into"));
  }
  {
    auto view = ckpt::tools::DataDirView::Open(data_dir);
    if (!view.ok()) return Fail("restore", view.status());
    auto shards = (*view)->StepShards(job, *step);
    if (!shards.ok()) return Fail("restore", shards.status());
    for (const proto::ShardRecord& r : *shards) {
      for (const ckpt::tools::TierCheck& c : (*view)->Verify(r)) {
        if (c.tier != "local_disk" || c.problems.empty()) continue;
        std::cerr << "ckpt restore: step " << *step << " rank " << c.rank
                  << " does not verify (" << c.path << ": "
                  << c.problems.front() << "); nothing was changed\n";
        return kExitProblems;
      }
    }
  }
  proto::RollBackRequest req;
  req.set_job(job);
  req.set_step(*step);
  req.set_into(into);
  req.set_discard_newer(discard_newer);
  auto resp = ckpt::client::RollBack(socket_path, req);
  if (!resp.ok()) return Fail("restore", resp.status());
  const proto::RollbackRecord& r = resp->record();
  if (json) {
    nlohmann::json j;
    j["job"] = r.job();
    j["step"] = r.to_step();
    j["from_step"] = r.from_step();
    if (!r.forked_from().empty()) j["forked_from"] = r.forked_from();
    if (!r.archived_as().empty()) j["archived_as"] = r.archived_as();
    j["dropped_steps"] = r.dropped_steps();
    std::cout << j.dump(2) << "\n";
  } else if (!r.forked_from().empty()) {
    std::printf(
        "job %s forked from job %s at step %lu: it resumes from there\n",
        r.job().c_str(), r.forked_from().c_str(),
        static_cast<unsigned long>(r.to_step()));
  } else {
    std::printf("job %s resumes from step %lu (was %lu); %u newer step(s) %s\n",
                r.job().c_str(), static_cast<unsigned long>(r.to_step()),
                static_cast<unsigned long>(r.from_step()), r.dropped_steps(),
                r.archived_as().empty()
                    ? "discarded"
                    : ("kept as job " + r.archived_as()).c_str());
  }
  return 0;
}

}  // namespace ckpt::cli
