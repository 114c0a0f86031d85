#include "client/shard_restorer.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/device_upload.h"
#include "client/landing_shard.h"
#include "client/resharder.h"
#include "client/slot_restore.h"
#include "io/bulk_transfer.h"
#include "io/file_system.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "io/thread_pool.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_stream.h"

namespace ckpt::client {

ShardRestorer::ShardRestorer(RestoreContext ctx, std::string what)
    : ctx_(ctx), what_(std::move(what)) {}

absl::StatusOr<proto::ShardRecord> ShardRestorer::Describe(uint64_t step) {
  proto::GetShardRequest req;
  req.mutable_shard()->set_job(ctx_.options.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(ctx_.options.rank);
  req.set_on_demand(true);  // OpenShardReader reads such a copy as it lands
  proto::GetShardResponse resp;
  RETURN_IF_ERROR(ctx_.rpc.Call(&proto::CkptDaemon::Stub::GetShard, req, &resp,
                                absl::StrCat("shard of step ", step)));
  return resp.shard();
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

absl::Status ShardRestorer::Restore(uint64_t step, uint32_t saved_world,
                                    bool* vanished) {
  absl::StatusOr<proto::ShardRecord> described = Describe(step);
  if (!described.ok()) {
    // ckptd refused every copy it could find (damaged, or not sealed with
    // the cluster key): other ranks may have saved the same boxes.
    const bool refused = absl::IsDataLoss(described.status()) ||
                         absl::IsPermissionDenied(described.status());
    if (!refused || ctx_.options.world_size == 1) return described.status();
    return FromOtherRanks(step, saved_world, described.status());
  }
  const proto::ShardRecord shard = *std::move(described);
  CKPT_KILL_POINT("client.shard_described");
  if (!Restorable(shard)) {
    return absl::FailedPreconditionError(
        absl::StrCat(what_, ": the shard is not staged (state ",
                     proto::ShardState_Name(shard.state()), ")"));
  }
  ASSIGN_OR_RETURN(std::optional<std::vector<const proto::StagedItem*>> sources,
                   MatchSaved(shard));
  // Same world, other boxes: the tensors are resharded.
  if (!sources.has_value())
    return Resharder(ctx_, what_).Restore(step, saved_world);
  // The persisted manifest, when there is one, carries the checksum of every
  // raw chunk: the memory-tier copy is checked against it before it is used.
  ShardFile file = OpenShardFile(shard);
  if (!shard.slot_path().empty()) {
    absl::Status from_slot = FromSlot(shard, *sources, file.reader.get());
    if (from_slot.ok()) return from_slot;
    if (file.reader == nullptr) {
      *vanished = absl::IsNotFound(from_slot) && absl::IsNotFound(file.status);
      return absl::Status(
          from_slot.code(),
          absl::StrCat(what_, ": memory tier: ", from_slot.message()));
    }
    CKPT_LOG_WARN("{}: memory tier unusable ({}); reading the shard file",
                  what_, from_slot.ToString());
    if (absl::IsDataLoss(from_slot)) ++ctx_.report.mismatches;
    ++ctx_.report.fallbacks;
  }
  absl::Status from_file = FromShardFile(shard, file, vanished);
  if (from_file.ok() || ctx_.options.world_size == 1 ||
      (!absl::IsDataLoss(from_file) && !absl::IsNotFound(from_file))) {
    return from_file;
  }
  return FromOtherRanks(step, saved_world, from_file);
}

absl::StatusOr<std::optional<std::vector<const proto::StagedItem*>>>
ShardRestorer::MatchSaved(const proto::ShardRecord& shard) const {
  std::unordered_map<std::string, const proto::StagedItem*> by_name;
  by_name.reserve(static_cast<size_t>(shard.items_size()));
  for (const proto::StagedItem& s : shard.items())
    by_name[s.item().name()] = &s;
  std::vector<const proto::StagedItem*> sources;
  for (const RegisteredItem& r : ctx_.items) {
    auto named = by_name.find(r.item.name());
    if (named == by_name.end()) {
      return absl::NotFoundError(
          absl::StrCat(what_, ": \"", r.item.name(), "\" was not saved"));
    }
    const proto::Item& saved = named->second->item();
    if (r.is_tensor() && SameTensor(saved, r.item) && !SameBox(saved, r.item)) {
      return std::nullopt;
    }
    if (r.is_tensor() &&
        !(SameTensor(saved, r.item) && SameBox(saved, r.item))) {
      return absl::FailedPreconditionError(absl::StrCat(
          what_, ": tensor \"", r.item.name(), "\" was saved as ",
          snapshot::DTypeName(saved.dtype()), " with another shape or box"));
    }
    sources.push_back(named->second);
  }
  return sources;
}

ShardRestorer::ShardFile ShardRestorer::OpenShardFile(
    const proto::ShardRecord& shard) {
  ShardFile file;
  if (shard.shard_path().empty()) return file;
  absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> opened =
      OpenShardReader(ctx_.rpc, shard);
  file.status = opened.status();
  if (opened.ok()) file.reader = *std::move(opened);
  return file;
}

absl::Status ShardRestorer::FromSlot(
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
  RETURN_IF_ERROR(CopyAndVerify(ctx_, slot->data(), sources, reader));
  for (const proto::StagedItem* s : sources)
    ctx_.report.memory_bytes += s->item().raw_size();
  return absl::OkStatus();
}

absl::Status ShardRestorer::FromShardFile(const proto::ShardRecord& shard,
                                          const ShardFile& file,
                                          bool* vanished) {
  if (file.reader == nullptr) {
    *vanished = absl::IsNotFound(file.status);
    if (shard.shard_path().empty()) {
      return absl::NotFoundError(
          absl::StrCat(what_, ": neither a slot nor a shard file is left"));
    }
    return file.status;
  }
  snapshot::ShardReader& reader = *file.reader;
  // Host memory (tensors and byte items) is read in one pass, so the disk
  // stays busy across small items; tensors in device memory through a pinned
  // buffer, read and copied to the device at once.
  std::vector<snapshot::ShardReader::ItemRead> direct;
  std::vector<std::pair<RegisteredItem*, std::string>> values;
  values.reserve(ctx_.items.size());
  std::vector<UploadTensor> uploads;
  for (RegisteredItem& r : ctx_.items) {
    ASSIGN_OR_RETURN(const proto::Item* item, reader.FindItem(r.item.name()));
    ctx_.report.disk_bytes += item->raw_size();
    if (r.is_tensor() && ctx_.device.host_resident()) {
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
  return UploadFromShard(&ctx_.device, reader, uploads,
                         ctx_.options.restore_buffer_bytes);
}

absl::Status ShardRestorer::FromOtherRanks(uint64_t step, uint32_t saved_world,
                                           const absl::Status& lost) {
  // This rank's copy is lost; other ranks may have saved the same boxes
  // (replicated, data-parallel state).
  absl::Status from_replicas =
      Resharder(ctx_, what_).Restore(step, saved_world);
  if (from_replicas.ok()) {
    CKPT_LOG_WARN("{} (restored from other ranks' replicas)", lost.ToString());
    ++ctx_.report.fallbacks;
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

absl::Status ShardRestorer::FromPeerStream(uint64_t step) {
  proto::GetShardRequest req;
  req.mutable_shard()->set_job(ctx_.options.job);
  req.mutable_shard()->set_step(step);
  req.mutable_shard()->set_rank(ctx_.options.rank);
  proto::PeerShardOffer offer;
  RETURN_IF_ERROR(ctx_.rpc.Call(&proto::CkptDaemon::Stub::OfferPeerShard, req,
                                &offer, what_));
  const std::string from =
      absl::StrCat(what_, ": from node ", offer.node(), "'s ",
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
  std::vector<std::string> values(ctx_.items.size());
  uint64_t bytes = 0;
  for (size_t k = 0; k < ctx_.items.size(); ++k) {
    RegisteredItem& r = ctx_.items[k];
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
          absl::StrCat(what_, ": \"", r.item.name(), "\" was not saved alike"));
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
  for (size_t k = 0; k < ctx_.items.size(); ++k) {
    if (!ctx_.items[k].is_tensor()) *ctx_.items[k].bytes = std::move(values[k]);
  }
  ctx_.report.peer_bytes += bytes;
  return absl::OkStatus();
}

}  // namespace ckpt::client
