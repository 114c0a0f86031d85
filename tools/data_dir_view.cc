#include "tools/data_dir_view.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/file_system.h"
#include "io/status_macros.h"
#include "nlohmann/json.hpp"
#include "snapshot/manifest_seal.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"

namespace ckpt::tools {

DataDirView::DataDirView(std::string data_dir,
                         std::unique_ptr<daemon::api::DataDirReader> reader)
    : data_dir_(std::move(data_dir)), reader_(std::move(reader)) {}

absl::StatusOr<std::unique_ptr<DataDirView>> DataDirView::Open(
    const std::string& data_dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<daemon::api::DataDirReader> reader,
                   daemon::api::DataDirReader::Open(data_dir));
  std::unique_ptr<DataDirView> view(
      new DataDirView(data_dir, std::move(reader)));
  view->daemon_ = ReadDaemonRecord(data_dir);
  return view;
}

absl::optional<DaemonRecord> ReadDaemonRecord(const std::string& data_dir) {
  std::ifstream in(io::JoinPath(data_dir, "ckptd.json"));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!in || !j.is_object()) return absl::nullopt;
  DaemonRecord d;
  d.socket = j.value("socket", "");
  d.node_id = j.value("node_id", "");
  d.staging_dir = j.value("staging_dir", "");
  d.replica_dir = j.value("replica_dir", "");
  d.shared_dir = j.value("shared_dir", "");
  return d;
}

std::vector<TierCheck> DataDirView::VerifyBeyond(
    const std::string& job, absl::optional<uint64_t> step) {
  std::vector<TierCheck> checks;
  if (!daemon_.has_value()) return checks;
  auto scan = [&](const std::string& tier, const std::string& dir) {
    if (dir.empty()) return;
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
      if (e.path().extension() == ".ckpt") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    for (const std::string& path : files) {
      unsigned long long s = 0;
      unsigned r = 0;
      const std::string name = std::filesystem::path(path).filename().string();
      if (std::sscanf(name.c_str(), "%20llu-%10u.ckpt", &s, &r) != 2) continue;
      if (step.has_value() && s != *step) continue;
      TierCheck c{tier, s, r, path};
      absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
          snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
      if (!reader.ok()) {
        c.problems.push_back(std::string(reader.status().message()));
      } else {
        const proto::ShardManifest& m = (*reader)->manifest();
        if (m.job() != job || m.step() != s || m.rank() != r) {
          c.problems.push_back(
              absl::StrCat(path, ": holds job ", m.job(), " step ", m.step(),
                           " rank ", m.rank(), ", not what its name says"));
        }
        for (const proto::Item& item : m.items())
          c.chunks += item.chunks_size();
        for (const absl::Status& e : (*reader)->VerifyAll())
          c.problems.push_back(std::string(e.message()));
      }
      checks.push_back(std::move(c));
    }
  };
  scan("peer",
       daemon_->replica_dir.empty()
           ? ""
           : io::JoinPath(io::JoinPath(daemon_->replica_dir, "held"), job));
  scan("shared", daemon_->shared_dir.empty()
                     ? ""
                     : io::JoinPath(daemon_->shared_dir, job));
  // The parity blocks held for peers (--peer-redundancy): complete ones must
  // still hash to what they did when their last contribution arrived.
  if (!daemon_->replica_dir.empty()) {
    for (daemon::api::ParityBlockCheck& b :
         daemon::api::VerifyParityBlocks(daemon_->replica_dir, job, step)) {
      TierCheck c{"parity", b.key.step(), 0, b.path};
      c.group = static_cast<int>(b.key.group());
      c.block = static_cast<int>(b.key.index());
      c.problems = std::move(b.problems);
      checks.push_back(std::move(c));
    }
  }
  return checks;
}

absl::StatusOr<std::vector<proto::JobRecord>> DataDirView::Jobs() {
  return reader_->Jobs();
}

absl::StatusOr<proto::JobRecord> DataDirView::Job(const std::string& job) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(job));
  ASSIGN_OR_RETURN(absl::optional<proto::JobRecord> record, reader_->Job(job));
  if (record.has_value()) return *record;
  ASSIGN_OR_RETURN(std::vector<proto::JobRecord> jobs, Jobs());
  std::vector<std::string> names;
  for (const proto::JobRecord& j : jobs) names.push_back(j.job());
  return absl::NotFoundError(absl::StrCat(
      "no job \"", job, "\" in ", data_dir_,
      " (jobs: ", names.empty() ? "none" : absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<std::vector<proto::ShardRecord>> DataDirView::Shards(
    const std::string& job) {
  RETURN_IF_ERROR(Job(job).status());
  return reader_->Shards(job);
}

absl::StatusOr<absl::optional<std::string>> DataDirView::InstallClusterKey() {
  ASSIGN_OR_RETURN(std::shared_ptr<const snapshot::SealKeys> keys,
                   reader_->ClusterKeys());
  if (keys == nullptr) return absl::optional<std::string>();
  std::string id = keys->current_id();
  snapshot::InstallSealKeys(std::move(keys));
  return absl::optional<std::string>(std::move(id));
}

absl::StatusOr<std::vector<proto::CommitRecord>> DataDirView::Commits(
    const std::string& job) {
  RETURN_IF_ERROR(Job(job).status());
  return reader_->Commits(job);
}

absl::StatusOr<std::vector<StepSummary>> DataDirView::Steps(
    const std::string& job, const std::vector<proto::CommitRecord>* given) {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards, Shards(job));
  std::vector<proto::CommitRecord> commits;
  if (given != nullptr) {
    commits = *given;
  } else {
    ASSIGN_OR_RETURN(commits, Commits(job));
  }
  std::map<uint64_t, StepSummary> steps;
  for (const proto::ShardRecord& r : shards) {
    StepSummary& s = steps[r.step()];
    s.step = r.step();
    s.world_size = r.world_size();
    if (!r.slot_path().empty() && r.state() != proto::SHARD_STAGING)
      ++s.ranks_in_memory;
    if (r.state() == proto::SHARD_PERSISTED && !r.shard_path().empty()) {
      ++s.ranks_on_disk;
      s.raw_bytes += r.raw_bytes();
      s.stored_bytes += r.stored_bytes();
      if (r.replica_nodes_size() > 0) ++s.ranks_on_peers;
    }
    if (r.state() == proto::SHARD_FAILED) ++s.ranks_failed;
    s.newest_unix_micros =
        std::max({s.newest_unix_micros, r.staged_unix_micros(),
                  r.persisted_unix_micros()});
  }
  for (const proto::CommitRecord& c : commits) {
    StepSummary& s = steps[c.step()];
    s.step = c.step();
    if (s.world_size == 0) s.world_size = c.world_size();
    s.committed.push_back(c.tier());
    s.newest_unix_micros =
        std::max(s.newest_unix_micros, c.committed_unix_micros());
  }
  std::vector<StepSummary> out;
  for (auto& [step, s] : steps) out.push_back(std::move(s));
  return out;
}

absl::StatusOr<std::vector<proto::ShardRecord>> DataDirView::StepShards(
    const std::string& job, uint64_t step) {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards, Shards(job));
  std::vector<proto::ShardRecord> out;
  std::vector<uint64_t> steps;
  for (proto::ShardRecord& r : shards) {
    if (steps.empty() || steps.back() != r.step()) steps.push_back(r.step());
    if (r.step() == step) out.push_back(std::move(r));
  }
  if (out.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job, " has no step ", step,
        " (steps: ", steps.empty() ? "none" : absl::StrJoin(steps, ", "), ")"));
  }
  return out;
}

std::vector<TierCheck> DataDirView::Verify(const proto::ShardRecord& shard) {
  std::vector<TierCheck> checks;
  absl::optional<proto::ShardManifest> manifest;
  if (shard.state() == proto::SHARD_PERSISTED && !shard.shard_path().empty()) {
    TierCheck disk{"local_disk", shard.step(), shard.rank(),
                   shard.shard_path()};
    absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
        snapshot::ShardReader::Open(io::DefaultFileSystem(),
                                    shard.shard_path());
    if (!reader.ok()) {
      disk.problems.push_back(std::string(reader.status().message()));
    } else {
      for (const proto::Item& item : (*reader)->manifest().items())
        disk.chunks += item.chunks_size();
      for (const absl::Status& e : (*reader)->VerifyAll())
        disk.problems.push_back(std::string(e.message()));
      // A manifest whose file is damaged can still describe the slot: its
      // checksums were verified when the reader opened it.
      manifest = (*reader)->manifest();
    }
    checks.push_back(std::move(disk));
  }
  if (!shard.slot_path().empty() && shard.state() != proto::SHARD_STAGING) {
    TierCheck memory{"memory", shard.step(), shard.rank(), shard.slot_path()};
    absl::StatusOr<std::unique_ptr<io::MappedFile>> slot =
        io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                         {.writable = false});
    if (!slot.ok()) {
      memory.problems.push_back(std::string(slot.status().message()));
    } else if (manifest.has_value()) {
      for (const proto::StagedItem& staged : shard.items()) {
        const proto::Item* item = nullptr;
        for (const proto::Item& m : manifest->items()) {
          if (m.name() == staged.item().name()) item = &m;
        }
        if (item == nullptr) {
          memory.problems.push_back(
              absl::StrCat(shard.slot_path(), ": item \"", staged.item().name(),
                           "\" is not in the persisted manifest"));
          continue;
        }
        const uint64_t at = staged.slot_offset();
        if (at > (*slot)->size() || item->raw_size() > (*slot)->size() - at) {
          memory.problems.push_back(absl::StrCat(
              shard.slot_path(), ": item \"", item->name(),
              "\" at slot offset ", at, " is past the slot's end"));
          continue;
        }
        memory.chunks += item->chunks_size();
        for (const absl::Status& e : snapshot::VerifyRawItem(
                 absl::MakeConstSpan((*slot)->data() + at, item->raw_size()),
                 *item)) {
          memory.problems.push_back(
              absl::StrCat(shard.slot_path(), ": ", e.message()));
        }
      }
    }
    checks.push_back(std::move(memory));
  }
  return checks;
}

}  // namespace ckpt::tools
