// CheckpointService: start-up recovery. What the catalog and the staging
// directory hold after a crash: staged slots adopted and persisted, partial
// stagings deleted, in-flight persists restarted.

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "daemon/common/describe.h"
#include "daemon/common/records.h"
#include "daemon/service/checkpoint_service.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::daemon {

absl::Status CheckpointService::Recover() {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards());
  std::set<std::string> keep_slots, keep_files;
  std::vector<proto::ShardRecord> to_persist;
  for (proto::ShardRecord& r : shards) {
    if (r.state() == proto::SHARD_STAGING) {
      // Never staged completely: nothing was promised about it.
      CKPT_LOG_INFO("recovery: dropping incompletely staged {}",
                    Describe(r.job(), r.step(), r.rank()));
      RETURN_IF_ERROR(catalog_->DeleteShard(r.job(), r.step(), r.rank()));
      continue;
    }
    if (!r.slot_path().empty()) keep_slots.insert(r.slot_path());
    if (!r.shard_path().empty()) keep_files.insert(r.shard_path());
    if (r.state() == proto::SHARD_STAGED) to_persist.push_back(r);
    // Persisted but short of its peers when the daemon went down.
    if (replicator_ != nullptr && r.state() == proto::SHARD_PERSISTED &&
        r.replica_nodes_size() < options_.replication.replicas) {
      replicator_->Enqueue(
          r, {r.replica_nodes().begin(), r.replica_nodes().end()});
    }
    if (parity_ != nullptr && r.state() == proto::SHARD_PERSISTED &&
        !r.parity_protected()) {
      parity_->Enqueue(r);
    }
    // Persisted, and due on the shared tier, but not copied there yet.
    if (shared_ != nullptr && r.state() == proto::SHARD_PERSISTED &&
        shared_->Wants(r.step()) &&
        !shared_->Has(r.job(), r.step(), r.rank())) {
      shared_->Enqueue(r);
    }
  }
  {
    // Jobs with shards when ckptd starts, or running by their goodput
    // record (a power loss may have taken every shard): it went down under
    // them. The newest shard's staging time stands for the last save before
    // that.
    std::map<std::string, int64_t> last_micros;
    for (const proto::ShardRecord& r : shards) {
      int64_t& last = last_micros[r.job()];
      last = std::max(last, r.staged_unix_micros());
    }
    for (const std::string& job : RestoreHealth()) last_micros.emplace(job, 0);
    for (const auto& [job, micros] : last_micros) {
      if (goodput_.WasRunning(job) == false) continue;  // it had ended cleanly
      health_.DaemonRestarted(
          job, micros > 0 ? absl::FromUnixMicros(micros) : absl::InfinitePast(),
          absl::Now());
      failures_.Failed(job, "daemon_restart",
                       "ckptd started under the job (its shards, or its "
                       "trainers' sessions, were there)",
                       /*incident=*/true, absl::Now());
    }
  }
  ASSIGN_OR_RETURN(std::vector<SlotInfo> adopted,
                   arena_->Recover([&](const SlotInfo& s) {
                     return keep_slots.count(s.path) > 0;
                   }));
  std::set<std::string> present;
  for (const SlotInfo& s : adopted) present.insert(s.path);
  for (proto::ShardRecord& r : to_persist) {
    if (present.count(r.slot_path()) == 0) {
      r.set_state(proto::SHARD_FAILED);
      r.set_error(absl::StrCat("staging slot ", r.slot_path(),
                               " was lost (node reboot?)"));
      r.clear_slot_path();
      RETURN_IF_ERROR(catalog_->PutShard(r));
      continue;
    }
    CKPT_LOG_INFO("recovery: adopting staged {}",
                  Describe(r.job(), r.step(), r.rank()));
    metrics_.Add("ckpt_recovered_shards_total", {{"job", r.job()}});
    Enqueue({r.job(), r.step(), r.rank()});
  }
  // What a previous run left for garbage collection (it went down before
  // collecting, or in the middle) goes now, before the first save needs the
  // room: with nothing to persist, nothing else would start a collection.
  for (const proto::ShardRecord& r : shards) queue_.RequestGc(r.job());
  // Shard files the catalog does not reference: temporaries of an interrupted
  // persist, or files whose garbage collection was interrupted after the
  // catalog forgot them.
  std::string shards_dir = io::JoinPath(options_.data_dir, "shards");
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs_->ListDir(shards_dir));
  for (const std::string& job : jobs) {
    absl::StatusOr<std::vector<std::string>> names =
        fs_->ListDir(io::JoinPath(shards_dir, job));
    if (!names.ok()) continue;
    for (const std::string& name : *names) {
      std::string path = io::JoinPath(io::JoinPath(shards_dir, job), name);
      if (keep_files.count(path) == 0) {
        CKPT_LOG_INFO("recovery: removing unreferenced {}", path);
        (void)fs_->Unlink(path);
      }
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> CheckpointService::RestoreHealth() {
  std::vector<std::string> running;
  absl::StatusOr<std::vector<proto::FailureHistory>> histories =
      catalog_->ListFailureHistories();
  if (histories.ok()) {
    for (const proto::FailureHistory& h : *histories) failures_.Restore(h);
  } else {
    CKPT_LOG_ERROR("recovery: the failures kept: {}",
                   histories.status().ToString());
  }
  absl::StatusOr<std::vector<proto::GoodputRecord>> goodput =
      catalog_->ListGoodput();
  if (goodput.ok()) {
    for (const proto::GoodputRecord& r : *goodput) {
      goodput_.Restore(r, absl::Now());
      if (r.running()) running.push_back(r.job());
    }
  } else {
    CKPT_LOG_ERROR("recovery: the goodput kept: {}",
                   goodput.status().ToString());
  }
  return running;
}

void CheckpointService::KeepHealth(const proto::FailureHistory& history) {
  if (catalog_ == nullptr) return;
  absl::Status s = catalog_->PutFailureHistory(history);
  if (!s.ok()) CKPT_LOG_ERROR("keeping the failures: {}", s.ToString());
}

void CheckpointService::KeepHealth(const proto::GoodputRecord& record) {
  if (catalog_ == nullptr) return;
  absl::Status s = catalog_->PutGoodput(record);
  if (!s.ok()) CKPT_LOG_ERROR("keeping the goodput: {}", s.ToString());
}

}  // namespace ckpt::daemon
