// CheckpointService: incremental saves. Each rank's last persisted shard is
// the base of its next save, which stores only the chunks that changed and
// records where the others lie (snapshot/FORMAT.md, format 3). A base in use
// by a persist is pinned: garbage collection keeps its file, and keeps the
// files of every base a kept shard names (RetentionPolicy::pinned and
// ShardRecord.base_steps). Persists never wait for a collection: pinning
// and dropping records meet only under the pin lock, briefly (see
// IncrementalBases, which holds the candidates and the pins; the policy of
// which candidate a save uses is here).

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>
#include <vector>

#include "daemon/common/describe.h"
#include "daemon/service/checkpoint_service.h"
#include "io/file_system.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/self_contained.h"
#include "snapshot/xxh3.h"

namespace ckpt::daemon {

std::shared_ptr<const snapshot::ShardBase> CheckpointService::PinBase(
    const proto::ShardRecord& r) {
  // With etcd, other nodes' collections forget the commit records of steps
  // they no longer hold, so a base's step can look uncommitted and be saved
  // again over its file after a job restart (chaos.node_losses_close_together
  // found that): Supersede then first makes the shards built on it
  // self-contained (DetachDependents).
  if (options_.full_every <= 1) return nullptr;
  const std::vector<IncrementalBases::Base> candidates =
      bases_.Candidates(r.job(), r.rank());
  for (const std::shared_ptr<const snapshot::ShardBase>& base : candidates) {
    const proto::ShardManifest& m = base->manifest;
    if (m.step() >= r.step() || m.world_size() != r.world_size()) continue;
    // The rank's chain is as long as allowed: a full save, not a fallback
    // to an older base (which would keep that one, and rewrite what changed
    // since it, for ever).
    if (m.increments() + 1 >= static_cast<uint32_t>(options_.full_every)) break;
    // Only a step committed on disk: what withdraws uncommitted steps (a rank
    // resuming from an earlier one, a step saved again) never deletes a
    // base.
    absl::StatusOr<absl::optional<proto::CommitRecord>> commit =
        coordinator_->GetCommit(r.job(), m.step(), proto::TIER_LOCAL_DISK);
    if (!commit.ok() || !commit->has_value()) continue;
    // The record still names the file, checked and pinned under the pin
    // lock: a collection either dropped the file before (the record says so)
    // or sees the pin when it drops records (ApplyDrops).
    auto still_there = [&] {
      absl::StatusOr<absl::optional<proto::ShardRecord>> record =
          catalog_->GetShard(r.job(), m.step(), r.rank());
      return record.ok() && record->has_value() &&
             (*record)->state() == proto::SHARD_PERSISTED &&
             !(*record)->shard_path().empty();
    };
    if (bases_.Pin(r.job(), r.rank(), m.step(), still_there)) return base;
  }
  CKPT_LOG_DEBUG(
      "{}: none of the rank's last {} shards is committed on disk and may be "
      "built on; this save stores every chunk",
      Describe(r.job(), r.step(), r.rank()), candidates.size());
  return nullptr;
}

void CheckpointService::UnpinBase(
    const proto::ShardRecord& r,
    const std::shared_ptr<const snapshot::ShardBase>& base) {
  if (base != nullptr) bases_.Unpin(r.job(), r.rank(), base->manifest.step());
}

std::shared_ptr<const snapshot::ShardBase> CheckpointService::WithBaseBytes(
    const proto::ShardRecord& r,
    std::shared_ptr<const snapshot::ShardBase> base) {
  if (base == nullptr || !options_.writer.xor_deltas) return base;
  const uint64_t step = base->manifest.step();
  absl::StatusOr<std::shared_ptr<io::MappedFile>> slot =
      arena_->MapLiveOrReleased({r.job(), step, r.rank()});
  absl::StatusOr<absl::optional<proto::ShardRecord>> record =
      catalog_->GetShard(r.job(), step, r.rank());
  if (!slot.ok() || !record.ok() || !record->has_value()) return base;
  // Where each of the base's items lay in its slot, in manifest order.
  struct Span {
    uint64_t offset, size;
  };
  std::vector<Span> items;
  for (const proto::StagedItem& staged : (*record)->items())
    items.push_back({staged.slot_offset(), staged.item().raw_size()});
  auto with = std::make_shared<snapshot::ShardBase>(*base);
  // The writer checks what this copies out against the base chunk's raw
  // checksum: a slot reused meanwhile gives no delta, never a wrong one.
  with->read_raw = [map = *std::move(slot), items = std::move(items)](
                       uint32_t item, uint64_t offset,
                       absl::Span<uint8_t> out) -> absl::Status {
    if (item >= items.size() || offset > items[item].size ||
        out.size() > items[item].size - offset ||
        items[item].offset + items[item].size > map->size()) {
      return absl::OutOfRangeError(absl::StrCat("item ", item, " bytes ",
                                                offset, "+", out.size(),
                                                " are not in the base's slot"));
    }
    std::memcpy(out.data(), map->data() + items[item].offset + offset,
                out.size());
    return absl::OkStatus();
  };
  return with;
}

void CheckpointService::RememberBase(const proto::ShardRecord& r,
                                     proto::ShardManifest manifest,
                                     uint64_t manifest_xxh3) {
  if (options_.full_every <= 1) return;
  auto base = std::make_shared<snapshot::ShardBase>();
  base->manifest = std::move(manifest);
  base->manifest_xxh3 = manifest_xxh3;
  bases_.Remember(r.job(), r.rank(), r.step(), std::move(base));
}

absl::Status CheckpointService::DetachDependents(
    const proto::ShardRecord& base) {
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   catalog_->ListShards(base.job()));
  // Rewriting a shard moves its chunks and changes its manifest, so the
  // shards built on it go too: every shard that names `base` or one of those
  // as a base (bases are earlier steps: one pass in step order finds them).
  std::sort(shards.begin(), shards.end(),
            [](const proto::ShardRecord& a, const proto::ShardRecord& b) {
              return a.step() < b.step();
            });
  std::set<uint64_t> moving = {base.step()};
  std::vector<proto::ShardRecord> dependents;
  for (proto::ShardRecord& r : shards) {
    if (r.rank() != base.rank() || r.state() != proto::SHARD_PERSISTED ||
        r.shard_path().empty() ||
        std::none_of(r.base_steps().begin(), r.base_steps().end(),
                     [&](uint64_t s) { return moving.count(s) > 0; })) {
      continue;
    }
    moving.insert(r.step());
    dependents.push_back(std::move(r));
  }
  // Newest first: each is read through its bases as they still are.
  for (auto it = dependents.rbegin(); it != dependents.rend(); ++it) {
    proto::ShardRecord& r = *it;
    const std::string what = Describe(r.job(), r.step(), r.rank());
    uint64_t stored = 0;
    auto detached = std::make_shared<snapshot::ShardBase>();
    absl::Status written = [&]() -> absl::Status {
      ASSIGN_OR_RETURN(snapshot::Detached file,
                       snapshot::MakeSelfContained(fs_, r.shard_path()));
      proto::ShardManifest& m = detached->manifest;
      detached->manifest_xxh3 = file.manifest_xxh3;
      if (!m.ParseFromString(file.manifest_bytes)) {
        return absl::DataLossError("its manifest does not parse");
      }
      for (const proto::Item& item : m.items()) {
        for (const proto::ChunkInfo& c : item.chunks()) {
          stored += c.stored_size();
        }
      }
      return absl::OkStatus();
    }();
    if (!written.ok()) {
      return absl::Status(
          written.code(),
          absl::StrCat(what, " stores chunks in step ", base.step(),
                       ", which is being saved again, and could not be made "
                       "self-contained: ",
                       written.message()));
    }
    r.clear_base_steps();
    r.set_stored_bytes(stored);
    RETURN_IF_ERROR(catalog_->PutShard(r));
    // The rank's next save may build on it: as the file it now is.
    bases_.Replace(r.job(), r.rank(), r.step(), std::move(detached));
    CKPT_LOG_INFO(
        "{}: made self-contained: step {}, which it stored chunks in, is "
        "being saved again",
        what, base.step());
  }
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
