#include "client/resharder.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/checkpointer_internal.h"
#include "client/device_upload.h"
#include "client/landing_shard.h"
#include "client/slot_restore.h"
#include "io/file_system.h"
#include "io/logging.h"
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

Resharder::Resharder(RestoreContext ctx, std::string what,
                     ReplicasAvoided avoided)
    : ctx_(ctx), what_(std::move(what)), avoided_(std::move(avoided)) {}

absl::Status Resharder::Restore(uint64_t step, uint32_t saved_world) {
  RETURN_IF_ERROR(DescribeSavedRanks(step, saved_world));
  RETURN_IF_ERROR(PinHalves());
  for (RegisteredItem& r : ctx_.items) {
    if (!r.is_tensor()) {
      RETURN_IF_ERROR(RestoreBytes(r));
      continue;
    }
    ASSIGN_OR_RETURN(std::vector<SavedBox> boxes, SavedBoxesOf(r));
    const snapshot::Box want = BoxOf(r.item);
    if (ctx_.device.host_resident()) {
      RETURN_IF_ERROR(
          AssembleBox(r, boxes, want, 0,
                      absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                          r.item.raw_size())));
    } else if (r.item.raw_size() > 0) {
      RETURN_IF_ERROR(Upload(r, boxes));
    }
  }
  return staging_ != nullptr ? staging_->Finish() : absl::OkStatus();
}

const proto::StagedItem* Resharder::SavedRank::Find(
    const std::string& name) const {
  for (const proto::StagedItem& s : shard.items()) {
    if (s.item().name() == name) return &s;
  }
  return nullptr;
}

absl::Status Resharder::DescribeSavedRanks(uint64_t step,
                                           uint32_t saved_world) {
  std::vector<SavedRank>& saved = saved_;
  saved.resize(saved_world);
  for (uint32_t o = 0; o < saved_world; ++o) {
    proto::GetShardRequest req;
    req.mutable_shard()->set_job(ctx_.options.job);
    req.mutable_shard()->set_step(step);
    req.mutable_shard()->set_rank(o);
    req.set_on_demand(true);  // OpenShardReader lands only the boxes read
    proto::GetShardResponse resp;
    absl::Status described =
        ctx_.rpc.Call(&proto::CkptDaemon::Stub::GetShard, req, &resp,
                      absl::StrCat(what_, ": saved rank ", o));
    if (absl::IsDataLoss(described) || absl::IsPermissionDenied(described)) {
      // ckptd refused every copy of it (damaged, or not sealed with the
      // cluster key): its boxes come from the ranks that saved them too, if
      // any (replicated state).
      CKPT_LOG_WARN("{}; reading its boxes from other ranks",
                    described.ToString());
      saved[o].shard.set_rank(o);
      saved[o].opened = true;
      saved[o].open_status = described;
      continue;
    }
    RETURN_IF_ERROR(described);
    if (!Restorable(resp.shard())) {
      return absl::FailedPreconditionError(
          absl::StrCat(what_, ": saved rank ", o, "'s shard is ",
                       proto::ShardState_Name(resp.shard().state())));
    }
    saved[o].shard = resp.shard();
  }
  return absl::OkStatus();
}

absl::Status Resharder::PinHalves() {
  // Device tensors are assembled in pinned halves of at most half of
  // restore_buffer_bytes, each copied to the device while the next is
  // assembled in the other: a tensor as a whole, or, when it is larger than a
  // half, in slabs (parts contiguous in its layout) that fit one.
  half_bound_ =
      std::max<uint64_t>(ctx_.options.restore_buffer_bytes / 2, kWidestElement);
  if (ctx_.device.host_resident()) return absl::OkStatus();
  uint64_t largest = 0;
  for (const RegisteredItem& r : ctx_.items) {
    if (r.is_tensor()) largest = std::max(largest, r.item.raw_size());
  }
  if (largest == 0) return absl::OkStatus();
  staging_ = std::make_unique<PinnedHalves>(&ctx_.device,
                                            std::min(largest, half_bound_));
  return staging_->Pin();
}

absl::Status Resharder::RestoreBytes(RegisteredItem& r) {
  // Byte items are per rank (RNG states, loader positions): a rank takes the
  // one of the saved rank with its number, else saved rank 0's; when that
  // copy is lost, another rank's (replicated state).
  const uint32_t saved_world = static_cast<uint32_t>(saved_.size());
  std::vector<uint32_t> order;
  if (ctx_.options.rank < saved_world) order.push_back(ctx_.options.rank);
  for (uint32_t o = 0; o < saved_world; ++o) {
    if (o != ctx_.options.rank) order.push_back(o);
  }
  absl::Status read;
  for (size_t k = 0; k < order.size(); ++k) {
    SavedRank& src = saved_[order[k]];
    const proto::StagedItem* staged = src.Find(r.item.name());
    if (staged == nullptr) {
      read = absl::NotFoundError(absl::StrCat(what_, ": \"", r.item.name(),
                                              "\" was not saved by rank ",
                                              src.shard.rank()));
    } else {
      read = Open(src);
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
      (src.slot != nullptr ? ctx_.report.memory_bytes
                           : ctx_.report.disk_bytes) += value.size();
      *r.bytes = std::move(value);
      return absl::OkStatus();
    }
    if (read.code() != absl::StatusCode::kDataLoss) return read;
    if (k + 1 < order.size()) ++ctx_.report.fallbacks;
  }
  return read;
}

absl::StatusOr<std::vector<Resharder::SavedBox>> Resharder::SavedBoxesOf(
    const RegisteredItem& r) {
  // The saved boxes overlapping this rank's box, grouped by box: the ranks of
  // one group are replicas (data-parallel state saved by every rank). One
  // replica of each group is read, the next one if it fails.
  const snapshot::Box want = BoxOf(r.item);
  std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>, SavedBox>
      groups;
  for (SavedRank& src : saved_) {
    const proto::StagedItem* staged = src.Find(r.item.name());
    if (staged == nullptr) continue;
    const proto::Item& had = staged->item();
    if (had.dtype() != r.item.dtype() ||
        !std::equal(had.global_shape().begin(), had.global_shape().end(),
                    r.item.global_shape().begin(),
                    r.item.global_shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          what_, ": tensor \"", r.item.name(), "\" was saved by rank ",
          src.shard.rank(), " as ", snapshot::DTypeName(had.dtype()),
          " with another global shape"));
    }
    snapshot::Box box = BoxOf(had);
    if (snapshot::Intersect(box, want).elements() == 0) continue;
    if (avoided_.count({r.item.name(), src.shard.rank()}) != 0) continue;
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
          return (a.rank->shard.rank() == ctx_.options.rank) >
                 (b.rank->shard.rank() == ctx_.options.rank);
        });
    if (replicas.front().rank->shard.rank() != ctx_.options.rank) {
      std::rotate(replicas.begin(),
                  replicas.begin() + ctx_.options.rank % replicas.size(),
                  replicas.end());
    }
    boxes.push_back(std::move(group));
  }
  return boxes;
}

absl::StatusOr<int64_t> Resharder::CopyOverlap(const RegisteredItem& r,
                                               const snapshot::Box& box,
                                               SavedRank& src,
                                               const proto::StagedItem& staged,
                                               const snapshot::Box& want,
                                               absl::Span<uint8_t> dst) {
  const proto::Item& had = staged.item();
  const size_t width = snapshot::DTypeSize(r.item.dtype());
  const snapshot::Box common = snapshot::Intersect(box, want);
  RETURN_IF_ERROR(Open(src));
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
    std::vector<uint8_t>& part = scratch_;
    part.resize(had.raw_size());
    RETURN_IF_ERROR(src.reader->ReadItemRange(
        r.item.name(), lo, absl::MakeSpan(part.data() + lo, hi - lo)));
    bytes = part.data();
  }
  (src.slot != nullptr ? ctx_.report.memory_bytes : ctx_.report.disk_bytes) +=
      common.elements() * width;
  return snapshot::CopyBoxIntersection(
      absl::MakeConstSpan(bytes, had.raw_size()), box, dst, want, width);
}

absl::Status Resharder::AssembleBox(const RegisteredItem& r,
                                    const std::vector<SavedBox>& boxes,
                                    const snapshot::Box& part_box,
                                    int64_t first, absl::Span<uint8_t> dst) {
  int64_t covered = 0;
  for (const SavedBox& saved : boxes) {
    if (snapshot::Intersect(saved.box, part_box).elements() == 0) continue;
    absl::StatusOr<int64_t> copied;
    for (size_t i = 0; i < saved.replicas.size(); ++i) {
      const SavedBox::Replica& replica = saved.replicas[i];
      copied = CopyOverlap(r, saved.box, *replica.rank, *replica.staged,
                           part_box, dst);
      if (copied.ok()) break;
      if (i + 1 < saved.replicas.size())
        ctx_.report.fallbacks++;  // another one
    }
    if (!copied.ok()) return copied.status();
    covered += *copied;
  }
  if (covered == part_box.elements()) return absl::OkStatus();
  const bool whole = part_box.elements() == BoxOf(r.item).elements();
  return absl::NotFoundError(absl::StrCat(
      what_, ": tensor \"", r.item.name(), "\": the shards saved by ",
      saved_.size(), " rank(s) cover ", covered, " of the ",
      part_box.elements(), " elements of ",
      whole ? std::string("this rank's box")
            : absl::StrCat("this rank's box from its element ", first),
      covered > part_box.elements() ? " (saved boxes overlap)" : ""));
}

absl::Status Resharder::Upload(RegisteredItem& r,
                               const std::vector<SavedBox>& boxes) {
  const size_t width = snapshot::DTypeSize(r.item.dtype());
  PinnedHalves& staging = *staging_;
  // The bound, not the half: halves are rounded up to whole pages.
  const int64_t per_half = static_cast<int64_t>(
      std::min(staging.half(), half_bound_) / std::max<size_t>(width, 1));
  for (const snapshot::Slab& slab :
       snapshot::ContiguousSlabs(BoxOf(r.item), per_half)) {
    const uint64_t bytes = static_cast<uint64_t>(slab.box.elements()) * width;
    ASSIGN_OR_RETURN(uint8_t * area, staging.Fill(sent_));
    RETURN_IF_ERROR(AssembleBox(r, boxes, slab.box, slab.first,
                                absl::Span<uint8_t>(area, bytes)));
    RETURN_IF_ERROR(ctx_.device.CopyFromHost(
        area, static_cast<uint8_t*>(r.tensor) + slab.first * width, bytes));
    RETURN_IF_ERROR(staging.Send(sent_++));
  }
  return absl::OkStatus();
}

absl::Status Resharder::Open(SavedRank& saved) {
  if (!saved.opened) {
    saved.opened = true;
    saved.open_status = OpenOnce(saved);
  }
  return saved.open_status;
}

absl::Status Resharder::OpenOnce(SavedRank& saved) {
  const proto::ShardRecord& shard = saved.shard;
  absl::Status reader_status = absl::NotFoundError("no shard file");
  if (!shard.shard_path().empty()) {
    auto opened = OpenShardReader(ctx_.rpc, shard);
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
                          absl::StrCat(what_, ": saved rank ", shard.rank(),
                                       ": memory tier: ", usable.message()));
    }
    CKPT_LOG_WARN("{}: saved rank {}: memory tier unusable ({}); reading {}",
                  what_, shard.rank(), usable.ToString(), shard.shard_path());
    if (usable.code() == absl::StatusCode::kDataLoss) ++ctx_.report.mismatches;
    ++ctx_.report.fallbacks;
  }
  if (saved.reader == nullptr) {
    return absl::Status(
        reader_status.code(),
        absl::StrCat(what_, ": saved rank ", shard.rank(), ": ",
                     shard.shard_path().empty()
                         ? "neither a slot nor a shard file is left"
                         : reader_status.message()));
  }
  return absl::OkStatus();
}

}  // namespace ckpt::client
