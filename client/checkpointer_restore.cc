#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/device_upload.h"
#include "io/bulk_transfer.h"
#include "io/file_system.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_stream.h"

namespace ckpt::client {

absl::Status Checkpointer::Restore(uint64_t step) {
  report_ = RestoreReport();
  absl::Status restored = RestoreFrom(step);
  if (restored.ok()) {
    // The figures are for the metrics; for a trainer (not read_only) the
    // report also withdraws its shards of newer uncommitted steps, which must
    // succeed before it saves again.
    proto::ReportRestoreRequest req;
    req.mutable_shard()->set_job(options_.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(options_.rank);
    req.set_memory_bytes(report_.memory_bytes);
    req.set_local_disk_bytes(report_.disk_bytes);
    req.set_peer_bytes(report_.peer_bytes);
    req.set_checksum_mismatches(report_.mismatches);
    req.set_fallbacks(report_.fallbacks);
    req.set_resume(!options_.read_only);
    proto::ReportRestoreResponse ignored;
    // Resuming withdraws the rank's newer uncommitted shards one by one: a
    // job that ran far past its last commit has hundreds (chaos seed
    // 3734966263: 160 steps took longer than the usual deadline on a loaded
    // machine).
    absl::Status reported =
        rpc_->Call(&proto::CkptDaemon::Stub::ReportRestore, req, &ignored,
                   absl::StrCat("resuming from step ", step),
                   req.resume() ? absl::Minutes(5) : absl::ZeroDuration());
    if (req.resume()) return reported;
  }
  return restored;
}

absl::StatusOr<absl::optional<uint64_t>> Checkpointer::RestoreLatest(
    proto::Tier tier) {
  constexpr int kAttempts = 5;
  absl::Status failed;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    ASSIGN_OR_RETURN(absl::optional<uint64_t> latest, LatestCommitted(tier));
    if (!latest.has_value()) return latest;
    failed = Restore(*latest);
    if (failed.ok()) return latest;
    ASSIGN_OR_RETURN(absl::optional<uint64_t> now, LatestCommitted(tier));
    if (!now.has_value() || *now == *latest) return failed;
  }
  return failed;
}

absl::Status Checkpointer::RestoreFrom(uint64_t step) {
  DrainHandovers();
  const std::string what = absl::StrCat(
      "restoring job ", options_.job, " step ", step, " rank ", options_.rank);
  // Only a committed step is restored: a step some rank never saved would mix
  // states of different steps.
  proto::ListCommitsRequest list;
  list.set_job(options_.job);
  list.set_step(step);
  proto::ListCommitsResponse commits;
  RETURN_IF_ERROR(
      rpc_->Call(&proto::CkptDaemon::Stub::ListCommits, list, &commits, what));
  auto commit = std::find_if(
      commits.commits().begin(), commits.commits().end(),
      [step](const proto::CommitRecord& c) { return c.step() == step; });
  if (commit == commits.commits().end()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": step ", step, " is not committed at any tier"));
  }
  if (commit->world_size() != options_.world_size) {
    return RestoreResharded(step, commit->world_size(), what);
  }
  if (device_->host_resident()) {
    // A shard on no local tier streams straight from a peer into place.
    absl::Status streamed = RestoreFromPeerStream(step, what);
    if (streamed.ok()) return streamed;
    if (!absl::IsFailedPrecondition(streamed) && !absl::IsNotFound(streamed)) {
      CKPT_LOG_WARN("{}: streaming from a peer failed ({}); ckptd fetches it",
                    what, streamed.ToString());
      if (absl::IsDataLoss(streamed)) ++report_.mismatches;
      ++report_.fallbacks;
    }
  }
  // The copies ckptd names may go before they are read (retention dropped
  // them meanwhile: a newer step committed, or the step is kept elsewhere);
  // ckptd is then asked again, and names what is left (peers, shared tier).
  constexpr int kAttempts = 3;
  absl::Status restored;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    bool vanished = false;
    restored = RestoreShard(step, commit->world_size(), what, &vanished);
    if (restored.ok() || !vanished) break;
    CKPT_LOG_WARN("{} ({}); asking ckptd again", restored.ToString(),
                  "its copies on this node were dropped while it was read");
    ++report_.fallbacks;
  }
  return restored;
}

namespace {

bool SameTensor(const proto::Item& a, const proto::Item& b) {
  return a.dtype() == b.dtype() &&
         std::equal(a.global_shape().begin(), a.global_shape().end(),
                    b.global_shape().begin(), b.global_shape().end());
}

bool SameBox(const proto::Item& a, const proto::Item& b) {
  return std::equal(a.box_offset().begin(), a.box_offset().end(),
                    b.box_offset().begin(), b.box_offset().end()) &&
         std::equal(a.box_length().begin(), a.box_length().end(),
                    b.box_length().begin(), b.box_length().end());
}

}  // namespace

absl::Status Checkpointer::RestoreShard(uint64_t step, uint32_t saved_world,
                                        const std::string& what,
                                        bool* vanished) {
  ASSIGN_OR_RETURN(const proto::ShardRecord shard, DescribeShard(step));
  CKPT_KILL_POINT("client.shard_described");
  if (!Restorable(shard)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the shard is not staged (state ",
                     proto::ShardState_Name(shard.state()), ")"));
  }
  ASSIGN_OR_RETURN(std::optional<std::vector<const proto::StagedItem*>> sources,
                   MatchSaved(shard, what));
  // Same world, other boxes: the tensors are resharded.
  if (!sources.has_value()) return RestoreResharded(step, saved_world, what);
  // The persisted manifest, when there is one, carries the checksum of every
  // raw chunk: the memory-tier copy is checked against it before it is used.
  ShardFile file = OpenShardFile(shard);
  if (!shard.slot_path().empty()) {
    absl::Status from_slot =
        RestoreFromSlot(shard, *sources, file.reader.get());
    if (from_slot.ok()) return from_slot;
    if (file.reader == nullptr) {
      *vanished = absl::IsNotFound(from_slot) && absl::IsNotFound(file.status);
      return absl::Status(
          from_slot.code(),
          absl::StrCat(what, ": memory tier: ", from_slot.message()));
    }
    CKPT_LOG_WARN("{}: memory tier unusable ({}); reading the shard file", what,
                  from_slot.ToString());
    if (absl::IsDataLoss(from_slot)) ++report_.mismatches;
    ++report_.fallbacks;
  }
  absl::Status from_file = RestoreFromShardFile(shard, file, what, vanished);
  if (from_file.ok() || options_.world_size == 1 ||
      (!absl::IsDataLoss(from_file) && !absl::IsNotFound(from_file))) {
    return from_file;
  }
  return RestoreFromOtherRanks(step, saved_world, what, from_file);
}

absl::StatusOr<std::optional<std::vector<const proto::StagedItem*>>>
Checkpointer::MatchSaved(const proto::ShardRecord& shard,
                         const std::string& what) const {
  std::unordered_map<std::string, const proto::StagedItem*> by_name;
  by_name.reserve(static_cast<size_t>(shard.items_size()));
  for (const proto::StagedItem& s : shard.items())
    by_name[s.item().name()] = &s;
  std::vector<const proto::StagedItem*> sources;
  for (const Registered& r : items_) {
    auto named = by_name.find(r.item.name());
    if (named == by_name.end()) {
      return absl::NotFoundError(
          absl::StrCat(what, ": \"", r.item.name(), "\" was not saved"));
    }
    const proto::Item& saved = named->second->item();
    if (r.is_tensor() && SameTensor(saved, r.item) && !SameBox(saved, r.item)) {
      return std::nullopt;
    }
    if (r.is_tensor() &&
        !(SameTensor(saved, r.item) && SameBox(saved, r.item))) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": tensor \"", r.item.name(), "\" was saved as ",
          snapshot::DTypeName(saved.dtype()), " with another shape or box"));
    }
    sources.push_back(named->second);
  }
  return sources;
}

Checkpointer::ShardFile Checkpointer::OpenShardFile(
    const proto::ShardRecord& shard) {
  ShardFile file;
  if (shard.shard_path().empty()) return file;
  absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> opened =
      snapshot::ShardReader::Open(io::DefaultFileSystem(), shard.shard_path());
  file.status = opened.status();
  if (opened.ok()) file.reader = *std::move(opened);
  return file;
}

absl::Status Checkpointer::RestoreFromSlot(
    const proto::ShardRecord& shard,
    const std::vector<const proto::StagedItem*>& sources,
    const snapshot::ShardReader* reader) {
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::MappedFile> slot,
      io::DefaultFileSystem()->MapFile(shard.slot_path(), {.writable = false}));
  if (slot->size() < shard.slot_bytes()) {
    return absl::DataLossError(
        absl::StrCat("staging slot ", shard.slot_path(), " has ", slot->size(),
                     " bytes, expected ", shard.slot_bytes()));
  }
  // Each chunk is copied and then checked where it landed, while it is still
  // in the cache, on several threads: in host memory, or for device tensors
  // in a pinned buffer they then leave for the device from. What the trainer
  // got is what is verified (the slot is the daemon's, and a retention may
  // hand it to another save meanwhile).
  RETURN_IF_ERROR(CopyAndVerify(slot->data(), sources, reader));
  for (const proto::StagedItem* s : sources)
    report_.memory_bytes += s->item().raw_size();
  return absl::OkStatus();
}

absl::Status Checkpointer::RestoreFromShardFile(const proto::ShardRecord& shard,
                                                const ShardFile& file,
                                                const std::string& what,
                                                bool* vanished) {
  if (file.reader == nullptr) {
    *vanished = absl::IsNotFound(file.status);
    if (shard.shard_path().empty()) {
      return absl::NotFoundError(
          absl::StrCat(what, ": neither a slot nor a shard file is left"));
    }
    return file.status;
  }
  snapshot::ShardReader& reader = *file.reader;
  // Host memory (tensors and byte items) is read in one pass, so the disk
  // stays busy across small items; tensors in device memory through a pinned
  // buffer, read and copied to the device at once.
  std::vector<snapshot::ShardReader::ItemRead> direct;
  std::vector<std::pair<Registered*, std::string>> values;
  values.reserve(items_.size());
  std::vector<UploadTensor> uploads;
  for (Registered& r : items_) {
    ASSIGN_OR_RETURN(const proto::Item* item, reader.FindItem(r.item.name()));
    report_.disk_bytes += item->raw_size();
    if (r.is_tensor() && device_->host_resident()) {
      direct.push_back(
          {r.item.name(), absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                              r.item.raw_size())});
    } else if (r.is_tensor()) {
      uploads.push_back({r.item.name(), r.tensor, r.item.raw_size()});
    } else {
      std::string& value =
          values.emplace_back(&r, std::string(item->raw_size(), '\0')).second;
      direct.push_back(
          {r.item.name(),
           absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(value.data()),
                               value.size())});
    }
  }
  RETURN_IF_ERROR(reader.ReadItems(direct));
  for (auto& [r, value] : values) *r->bytes = std::move(value);
  return UploadFromShard(device_.get(), reader, uploads,
                         options_.restore_buffer_bytes);
}

absl::Status Checkpointer::RestoreFromOtherRanks(uint64_t step,
                                                 uint32_t saved_world,
                                                 const std::string& what,
                                                 const absl::Status& lost) {
  // This rank's copy is lost; other ranks may have saved the same boxes
  // (replicated, data-parallel state).
  absl::Status from_replicas = RestoreResharded(step, saved_world, what);
  if (from_replicas.ok()) {
    CKPT_LOG_WARN("{} (restored from other ranks' replicas)", lost.ToString());
    ++report_.fallbacks;
    return from_replicas;
  }
  return absl::Status(
      lost.code(),
      absl::StrCat(lost.message(), "; no other rank saved a replica: ",
                   from_replicas.message()));
}

namespace {
// Whether a saved item has the registered one's kind, dtype, shape and box.
bool SameLayout(const proto::Item& saved, const proto::Item& registered) {
  auto same = [](const auto& a, const auto& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end());
  };
  return saved.kind() == registered.kind() &&
         saved.dtype() == registered.dtype() &&
         same(saved.global_shape(), registered.global_shape()) &&
         same(saved.box_offset(), registered.box_offset()) &&
         same(saved.box_length(), registered.box_length());
}

}  // namespace

absl::Status Checkpointer::RestoreFromPeerStream(uint64_t step,
                                                 const std::string& what) {
  proto::GetShardRequest req;
  req.mutable_shard()->set_job(options_.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(options_.rank);
  proto::PeerShardOffer offer;
  RETURN_IF_ERROR(
      rpc_->Call(&proto::CkptDaemon::Stub::OfferPeerShard, req, &offer, what));
  const std::string from =
      absl::StrCat(what, ": from node ", offer.node(), "'s ",
                   offer.tier() == proto::TIER_PEER ? "memory" : "disk");
  absl::StatusOr<proto::ShardManifest> manifest =
      snapshot::ParseStreamManifest(offer.manifest(), offer.file_bytes());
  if (!manifest.ok()) {
    return absl::Status(manifest.status().code(),
                        absl::StrCat(from, ": ", manifest.status().message()));
  }
  // The registered items land in place; the others are read (and checked)
  // into scratch memory.
  std::vector<absl::Span<uint8_t>> dst(manifest->items_size());
  std::vector<std::string> values(items_.size());
  uint64_t bytes = 0;
  for (size_t k = 0; k < items_.size(); ++k) {
    Registered& r = items_[k];
    int m = 0;
    while (m < manifest->items_size() &&
           manifest->items(m).name() != r.item.name()) {
      ++m;
    }
    if (m == manifest->items_size() ||
        (r.is_tensor() && !SameLayout(manifest->items(m), r.item))) {
      // Not saved, or saved with other boxes: GetShard's path says so, or
      // reshards.
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": \"", r.item.name(), "\" was not saved alike"));
    }
    const uint64_t n = manifest->items(m).raw_size();
    if (r.is_tensor()) {
      dst[m] = absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor), n);
    } else {
      values[k].resize(n);
      dst[m] =
          absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(values[k].data()), n);
    }
    bytes += n;
  }
  std::vector<std::vector<uint8_t>> scratch;
  for (int m = 0; m < manifest->items_size(); ++m) {
    if (dst[m].data() != nullptr || manifest->items(m).raw_size() == 0)
      continue;
    scratch.emplace_back(manifest->items(m).raw_size());
    dst[m] = absl::MakeSpan(scratch.back());
  }
  absl::StatusOr<std::unique_ptr<io::BulkStream>> stream =
      io::BulkStream::Open(offer.host(), static_cast<int>(offer.port()),
                           offer.ticket(), absl::Seconds(30));
  absl::Status s = stream.status();
  if (s.ok() && (*stream)->size() != offer.file_bytes()) {
    s = absl::DataLossError(absl::StrCat("the file has ", (*stream)->size(),
                                         " bytes, the offer said ",
                                         offer.file_bytes()));
  }
  if (s.ok()) {
    // Compressed chunks decode on every core while the next ones arrive.
    io::ThreadPool decoders(
        static_cast<int>(std::max(2u, std::thread::hardware_concurrency())));
    s = snapshot::ReadShardStream(
        [&](absl::Span<uint8_t> out) { return (*stream)->Read(out); },
        offer.file_bytes(), *manifest, offer.manifest(), dst, &decoders);
  }
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat(from, ": ", s.message()));
  }
  for (size_t k = 0; k < items_.size(); ++k) {
    if (!items_[k].is_tensor()) *items_[k].bytes = std::move(values[k]);
  }
  report_.peer_bytes += bytes;
  return absl::OkStatus();
}

absl::Status Checkpointer::OpenSavedRank(SavedRank& saved,
                                         const std::string& what) {
  if (!saved.opened) {
    saved.opened = true;
    saved.open_status = OpenSavedRankOnce(saved, what);
  }
  return saved.open_status;
}

absl::Status Checkpointer::OpenSavedRankOnce(SavedRank& saved,
                                             const std::string& what) {
  const proto::ShardRecord& shard = saved.shard;
  absl::Status reader_status = absl::NotFoundError("no shard file");
  if (!shard.shard_path().empty()) {
    auto opened = snapshot::ShardReader::Open(io::DefaultFileSystem(),
                                              shard.shard_path());
    reader_status = opened.status();
    if (opened.ok()) saved.reader = *std::move(opened);
  }
  if (!shard.slot_path().empty()) {
    auto slot = io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                                 {.writable = false});
    absl::Status usable = slot.status();
    if (usable.ok() && (*slot)->size() < shard.slot_bytes()) {
      usable = absl::DataLossError(
          absl::StrCat("staging slot ", shard.slot_path(), " is short"));
    }
    if (usable.ok()) {
      std::vector<const proto::StagedItem*> all;
      for (const proto::StagedItem& s : shard.items()) all.push_back(&s);
      usable = VerifySlot((*slot)->data(), all, saved.reader.get());
    }
    if (usable.ok()) {
      saved.slot = *std::move(slot);
      return absl::OkStatus();
    }
    if (saved.reader == nullptr) {
      return absl::Status(usable.code(),
                          absl::StrCat(what, ": saved rank ", shard.rank(),
                                       ": memory tier: ", usable.message()));
    }
    CKPT_LOG_WARN("{}: saved rank {}: memory tier unusable ({}); reading {}",
                  what, shard.rank(), usable.ToString(), shard.shard_path());
    if (usable.code() == absl::StatusCode::kDataLoss) ++report_.mismatches;
    ++report_.fallbacks;
  }
  if (saved.reader == nullptr) {
    return absl::Status(
        reader_status.code(),
        absl::StrCat(what, ": saved rank ", shard.rank(), ": ",
                     shard.shard_path().empty()
                         ? "neither a slot nor a shard file is left"
                         : reader_status.message()));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::client
