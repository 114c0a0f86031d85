#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/device_upload.h"
#include "io/file_system.h"
#include "io/status_macros.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/box.h"
#include "snapshot/dtype.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

namespace {

// A slab is never less than one element.
constexpr uint64_t kWidestElement = 16;

snapshot::Box BoxOf(const proto::Item& item) {
  return {{item.box_offset().begin(), item.box_offset().end()},
          {item.box_length().begin(), item.box_length().end()}};
}

}  // namespace

absl::Status Checkpointer::RestoreResharded(uint64_t step, uint32_t saved_world,
                                            const std::string& what) {
  Reshard reshard;
  reshard.what = what;
  ASSIGN_OR_RETURN(reshard.saved, DescribeSavedRanks(step, saved_world, what));
  RETURN_IF_ERROR(PinReshardHalves(reshard));
  for (Registered& r : items_) {
    if (!r.is_tensor()) {
      RETURN_IF_ERROR(RestoreBytesResharded(r, reshard));
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<SavedBox> boxes, SavedBoxesOf(r, reshard));
    const snapshot::Box want = BoxOf(r.item);
    if (device_->host_resident()) {
      RETURN_IF_ERROR(
          AssembleBox(r, boxes, want, 0,
                      absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                          r.item.raw_size()),
                      reshard));
    } else if (r.item.raw_size() > 0) {
      RETURN_IF_ERROR(UploadResharded(r, boxes, reshard));
    }
  }
  return reshard.staging != nullptr ? reshard.staging->Finish()
                                    : absl::OkStatus();
}

absl::StatusOr<std::vector<Checkpointer::SavedRank>>
Checkpointer::DescribeSavedRanks(uint64_t step, uint32_t saved_world,
                                 const std::string& what) {
  std::vector<SavedRank> saved(saved_world);
  for (uint32_t o = 0; o < saved_world; ++o) {
    proto::GetShardRequest req;
    req.mutable_shard()->set_job(options_.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(o);
    proto::GetShardResponse resp;
    RETURN_IF_ERROR(rpc_->Call(&proto::CkptDaemon::Stub::GetShard, req, &resp,
                               absl::StrCat(what, ": saved rank ", o)));
    if (!Restorable(resp.shard())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": saved rank ", o, "'s shard is ",
                       proto::ShardState_Name(resp.shard().state())));
    }
    saved[o].shard = resp.shard();
  }
  return saved;
}

absl::Status Checkpointer::PinReshardHalves(Reshard& reshard) {
  // Device tensors are assembled in pinned halves of at most half of
  // restore_buffer_bytes, each copied to the device while the next is
  // assembled in the other: a tensor as a whole, or, when it is larger than a
  // half, in slabs (parts contiguous in its layout) that fit one.
  reshard.half_bound =
      std::max<uint64_t>(options_.restore_buffer_bytes / 2, kWidestElement);
  if (device_->host_resident()) return absl::OkStatus();
  uint64_t largest = 0;
  for (const Registered& r : items_) {
    if (r.is_tensor()) largest = std::max(largest, r.item.raw_size());
  }
  if (largest == 0) return absl::OkStatus();
  reshard.staging = std::make_unique<PinnedHalves>(
      device_.get(), std::min(largest, reshard.half_bound));
  return reshard.staging->Pin();
}

absl::Status Checkpointer::RestoreBytesResharded(Registered& r,
                                                 Reshard& reshard) {
  // Byte items are per rank (RNG states, loader positions): a rank takes the
  // one of the saved rank with its number, else saved rank 0's; when that
  // copy is lost, another rank's (replicated state).
  const uint32_t saved_world = static_cast<uint32_t>(reshard.saved.size());
  std::vector<uint32_t> order;
  if (options_.rank < saved_world) order.push_back(options_.rank);
  for (uint32_t o = 0; o < saved_world; ++o) {
    if (o != options_.rank) order.push_back(o);
  }
  absl::Status read;
  for (size_t k = 0; k < order.size(); ++k) {
    SavedRank& src = reshard.saved[order[k]];
    const proto::StagedItem* staged = src.Find(r.item.name());
    if (staged == nullptr) {
      read = absl::NotFoundError(
          absl::StrCat(reshard.what, ": \"", r.item.name(),
                       "\" was not saved by rank ", src.shard.rank()));
    } else {
      read = OpenSavedRank(src, reshard.what);
    }
    std::string value;
    if (read.ok()) {
      value.assign(staged->item().raw_size(), '\0');
      if (src.slot != nullptr) {
        std::memcpy(value.data(), src.slot->data() + staged->slot_offset(),
                    value.size());
      } else {
        read = src.reader->ReadItem(
            r.item.name(),
            absl::Span<uint8_t>(reinterpret_cast<uint8_t*>(value.data()),
                                value.size()));
      }
    }
    if (read.ok()) {
      (src.slot != nullptr ? report_.memory_bytes : report_.disk_bytes) +=
          value.size();
      *r.bytes = std::move(value);
      return absl::OkStatus();
    }
    if (read.code() != absl::StatusCode::kDataLoss) return read;
    if (k + 1 < order.size()) ++report_.fallbacks;
  }
  return read;
}

absl::StatusOr<std::vector<Checkpointer::SavedBox>> Checkpointer::SavedBoxesOf(
    const Registered& r, Reshard& reshard) {
  // The saved boxes overlapping this rank's box, grouped by box: the ranks of
  // one group are replicas (data-parallel state saved by every rank). One
  // replica of each group is read, the next one if it fails.
  const snapshot::Box want = BoxOf(r.item);
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, SavedBox>
      groups;
  for (SavedRank& src : reshard.saved) {
    const proto::StagedItem* staged = src.Find(r.item.name());
    if (staged == nullptr) continue;
    const proto::Item& had = staged->item();
    if (had.dtype() != r.item.dtype() ||
        !std::equal(had.global_shape().begin(), had.global_shape().end(),
                    r.item.global_shape().begin(),
                    r.item.global_shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          reshard.what, ": tensor \"", r.item.name(), "\" was saved by rank ",
          src.shard.rank(), " as ", snapshot::DTypeName(had.dtype()),
          " with another global shape"));
    }
    snapshot::Box box = BoxOf(had);
    if (snapshot::Intersect(box, want).elements() == 0) continue;
    SavedBox& group = groups[{box.offset, box.length}];
    group.box = std::move(box);
    group.replicas.push_back({&src, staged});
  }
  std::vector<SavedBox> boxes;
  for (auto& [key, group] : groups) {
    // Spread the reads of replicated state over the saved ranks: this rank
    // starts with the replica of its own number when there is one.
    std::vector<SavedBox::Replica>& replicas = group.replicas;
    std::stable_sort(
        replicas.begin(), replicas.end(),
        [&](const SavedBox::Replica& a, const SavedBox::Replica& b) {
          return (a.rank->shard.rank() == options_.rank) >
                 (b.rank->shard.rank() == options_.rank);
        });
    if (replicas.front().rank->shard.rank() != options_.rank) {
      std::rotate(replicas.begin(),
                  replicas.begin() + options_.rank % replicas.size(),
                  replicas.end());
    }
    boxes.push_back(std::move(group));
  }
  return boxes;
}

absl::StatusOr<int64_t> Checkpointer::CopyOverlap(
    const Registered& r, const snapshot::Box& box, SavedRank& src,
    const proto::StagedItem& staged, const snapshot::Box& want,
    absl::Span<uint8_t> dst, Reshard& reshard) {
  const proto::Item& had = staged.item();
  const size_t width = snapshot::DTypeSize(r.item.dtype());
  const snapshot::Box common = snapshot::Intersect(box, want);
  RETURN_IF_ERROR(OpenSavedRank(src, reshard.what));
  const uint8_t* bytes;
  if (src.slot != nullptr) {
    bytes = src.slot->data() + staged.slot_offset();
  } else {
    // Only the byte range spanning the overlap is read (and only the chunks
    // under it decoded).
    auto flat = [&](bool last) {
      int64_t i = 0;
      for (size_t d = 0; d < box.offset.size(); ++d) {
        int64_t at = common.offset[d] + (last ? common.length[d] - 1 : 0);
        i = i * box.length[d] + (at - box.offset[d]);
      }
      return static_cast<uint64_t>(i);
    };
    const uint64_t lo = flat(false) * width, hi = (flat(true) + 1) * width;
    std::vector<uint8_t>& part = reshard.scratch;
    part.resize(had.raw_size());
    RETURN_IF_ERROR(src.reader->ReadItemRange(
        r.item.name(), lo, absl::MakeSpan(part.data() + lo, hi - lo)));
    bytes = part.data();
  }
  (src.slot != nullptr ? report_.memory_bytes : report_.disk_bytes) +=
      common.elements() * width;
  return snapshot::CopyBoxIntersection(
      absl::MakeConstSpan(bytes, had.raw_size()), box, dst, want, width);
}

absl::Status Checkpointer::AssembleBox(const Registered& r,
                                       const std::vector<SavedBox>& boxes,
                                       const snapshot::Box& part_box,
                                       int64_t first, absl::Span<uint8_t> dst,
                                       Reshard& reshard) {
  int64_t covered = 0;
  for (const SavedBox& saved : boxes) {
    if (snapshot::Intersect(saved.box, part_box).elements() == 0) continue;
    absl::StatusOr<int64_t> copied;
    for (size_t i = 0; i < saved.replicas.size(); ++i) {
      const SavedBox::Replica& replica = saved.replicas[i];
      copied = CopyOverlap(r, saved.box, *replica.rank, *replica.staged,
                           part_box, dst, reshard);
      if (copied.ok()) break;
      if (i + 1 < saved.replicas.size()) report_.fallbacks++;  // another one
    }
    if (!copied.ok()) return copied.status();
    covered += *copied;
  }
  if (covered == part_box.elements()) return absl::OkStatus();
  const bool whole = part_box.elements() == BoxOf(r.item).elements();
  return absl::NotFoundError(absl::StrCat(
      reshard.what, ": tensor \"", r.item.name(), "\": the shards saved by ",
      reshard.saved.size(), " rank(s) cover ", covered, " of the ",
      part_box.elements(), " elements of ",
      whole ? std::string("this rank's box")
            : absl::StrCat("this rank's box from its element ", first),
      covered > part_box.elements() ? " (saved boxes overlap)" : ""));
}

absl::Status Checkpointer::UploadResharded(Registered& r,
                                           const std::vector<SavedBox>& boxes,
                                           Reshard& reshard) {
  const size_t width = snapshot::DTypeSize(r.item.dtype());
  PinnedHalves& staging = *reshard.staging;
  // The bound, not the half: halves are rounded up to whole pages.
  const int64_t per_half =
      static_cast<int64_t>(std::min(staging.half(), reshard.half_bound) /
                           std::max<size_t>(width, 1));
  for (const snapshot::Slab& slab :
       snapshot::ContiguousSlabs(BoxOf(r.item), per_half)) {
    const uint64_t bytes = static_cast<uint64_t>(slab.box.elements()) * width;
    ASSIGN_OR_RETURN(uint8_t * area, staging.Fill(reshard.sent));
    RETURN_IF_ERROR(AssembleBox(r, boxes, slab.box, slab.first,
                                absl::Span<uint8_t>(area, bytes), reshard));
    RETURN_IF_ERROR(device_->CopyFromHost(
        area, static_cast<uint8_t*>(r.tensor) + slab.first * width, bytes));
    RETURN_IF_ERROR(staging.Send(reshard.sent++));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::client
