#include <algorithm>
#include <cstring>

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

absl::Status Checkpointer::RestoreResharded(uint64_t step, uint32_t saved_world,
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
  std::vector<uint8_t> part;
  // Device tensors are assembled in pinned halves of at most half of
  // restore_buffer_bytes, each copied to the device while the next is
  // assembled in the other: a tensor as a whole, or, when it is larger than a
  // half, in slabs (parts contiguous in its layout) that fit one.
  std::unique_ptr<PinnedHalves> staging;
  size_t sent = 0;
  constexpr uint64_t kWidestElement = 16;  // a slab is never less than one
  const uint64_t half_bound =
      std::max<uint64_t>(options_.restore_buffer_bytes / 2, kWidestElement);
  if (!device_->host_resident()) {
    uint64_t largest = 0;
    for (const Registered& r : items_) {
      if (r.is_tensor()) largest = std::max(largest, r.item.raw_size());
    }
    if (largest > 0) {
      staging = std::make_unique<PinnedHalves>(device_.get(),
                                               std::min(largest, half_bound));
      RETURN_IF_ERROR(staging->Pin());
    }
  }
  for (Registered& r : items_) {
    if (!r.is_tensor()) {
      // Byte items are per rank (RNG states, loader positions): a rank takes
      // the one of the saved rank with its number, else saved rank 0's; when
      // that copy is lost, another rank's (replicated state).
      std::vector<uint32_t> order;
      if (options_.rank < saved_world) order.push_back(options_.rank);
      for (uint32_t o = 0; o < saved_world; ++o) {
        if (o != options_.rank) order.push_back(o);
      }
      absl::Status read;
      for (size_t k = 0; k < order.size(); ++k) {
        SavedRank& src = saved[order[k]];
        const proto::StagedItem* staged = src.Find(r.item.name());
        if (staged == nullptr) {
          read = absl::NotFoundError(absl::StrCat(what, ": \"", r.item.name(),
                                                  "\" was not saved by rank ",
                                                  src.shard.rank()));
        } else {
          read = OpenSavedRank(src, what);
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
          break;
        }
        if (read.code() != absl::StatusCode::kDataLoss) return read;
        if (k + 1 < order.size()) ++report_.fallbacks;
      }
      RETURN_IF_ERROR(read);
      continue;
    }
    const size_t width = snapshot::DTypeSize(r.item.dtype());
    const snapshot::Box want{
        {r.item.box_offset().begin(), r.item.box_offset().end()},
        {r.item.box_length().begin(), r.item.box_length().end()}};
    // The saved boxes overlapping this rank's box, grouped by box: the ranks
    // of one group are replicas (data-parallel state saved by every rank).
    // One replica of each group is read, the next one if it fails.
    struct Source {
      SavedRank* rank;
      const proto::StagedItem* staged;
    };
    std::map<std::pair<std::vector<int64_t>, std::vector<int64_t>>,
             std::vector<Source>>
        groups;
    for (SavedRank& src : saved) {
      const proto::StagedItem* staged = src.Find(r.item.name());
      if (staged == nullptr) continue;
      const proto::Item& had = staged->item();
      if (had.dtype() != r.item.dtype() ||
          !std::equal(had.global_shape().begin(), had.global_shape().end(),
                      r.item.global_shape().begin(),
                      r.item.global_shape().end())) {
        return absl::FailedPreconditionError(absl::StrCat(
            what, ": tensor \"", r.item.name(), "\" was saved by rank ",
            src.shard.rank(), " as ", snapshot::DTypeName(had.dtype()),
            " with another global shape"));
      }
      snapshot::Box box{{had.box_offset().begin(), had.box_offset().end()},
                        {had.box_length().begin(), had.box_length().end()}};
      if (snapshot::Intersect(box, want).elements() == 0) continue;
      groups[{std::move(box.offset), std::move(box.length)}].push_back(
          {&src, staged});
    }
    // Copies the overlap of one saved box with `want`, laid out in `dst`;
    // returns the elements copied.
    auto copy_from = [&](const Source& source, const snapshot::Box& want,
                         absl::Span<uint8_t> dst) -> absl::StatusOr<int64_t> {
      SavedRank& src = *source.rank;
      const proto::Item& had = source.staged->item();
      const snapshot::Box box{
          {had.box_offset().begin(), had.box_offset().end()},
          {had.box_length().begin(), had.box_length().end()}};
      const snapshot::Box common = snapshot::Intersect(box, want);
      RETURN_IF_ERROR(OpenSavedRank(src, what));
      const uint8_t* bytes;
      if (src.slot != nullptr) {
        bytes = src.slot->data() + source.staged->slot_offset();
      } else {
        // Only the byte range spanning the overlap is read (and only the
        // chunks under it decoded).
        auto flat = [&](bool last) {
          int64_t i = 0;
          for (size_t d = 0; d < box.offset.size(); ++d) {
            int64_t at = common.offset[d] + (last ? common.length[d] - 1 : 0);
            i = i * box.length[d] + (at - box.offset[d]);
          }
          return static_cast<uint64_t>(i);
        };
        const uint64_t lo = flat(false) * width, hi = (flat(true) + 1) * width;
        part.resize(had.raw_size());
        RETURN_IF_ERROR(src.reader->ReadItemRange(
            r.item.name(), lo, absl::MakeSpan(part.data() + lo, hi - lo)));
        bytes = part.data();
      }
      (src.slot != nullptr ? report_.memory_bytes : report_.disk_bytes) +=
          common.elements() * width;
      return snapshot::CopyBoxIntersection(
          absl::MakeConstSpan(bytes, had.raw_size()), box, dst, want, width);
    };
    for (auto& [box, replicas] : groups) {
      // Spread the reads of replicated state over the saved ranks: this rank
      // starts with the replica of its own number when there is one.
      std::stable_sort(replicas.begin(), replicas.end(),
                       [&](const Source& a, const Source& b) {
                         return (a.rank->shard.rank() == options_.rank) >
                                (b.rank->shard.rank() == options_.rank);
                       });
      if (replicas.front().rank->shard.rank() != options_.rank) {
        std::rotate(replicas.begin(),
                    replicas.begin() + options_.rank % replicas.size(),
                    replicas.end());
      }
    }
    // Fills `dst`, laid out over `part_box` (the rank's box or a slab of it),
    // from one replica of every group overlapping it.
    // `first`: where the part starts in the box's layout.
    auto assemble = [&](const snapshot::Box& part_box, int64_t first,
                        absl::Span<uint8_t> dst) -> absl::Status {
      int64_t covered = 0;
      for (auto& [box, replicas] : groups) {
        const snapshot::Box saved{box.first, box.second};
        if (snapshot::Intersect(saved, part_box).elements() == 0) continue;
        absl::StatusOr<int64_t> copied;
        for (size_t i = 0; i < replicas.size(); ++i) {
          copied = copy_from(replicas[i], part_box, dst);
          if (copied.ok()) break;
          if (i + 1 < replicas.size()) report_.fallbacks++;  // another replica
        }
        if (!copied.ok()) return copied.status();
        covered += *copied;
      }
      if (covered != part_box.elements()) {
        return absl::NotFoundError(absl::StrCat(
            what, ": tensor \"", r.item.name(), "\": the shards saved by ",
            saved_world, " rank(s) cover ", covered, " of the ",
            part_box.elements(), " elements of ",
            part_box.elements() == want.elements()
                ? std::string("this rank's box")
                : absl::StrCat("this rank's box from its element ", first),
            covered > part_box.elements() ? " (saved boxes overlap)" : ""));
      }
      return absl::OkStatus();
    };
    if (device_->host_resident()) {
      RETURN_IF_ERROR(
          assemble(want, 0,
                   absl::Span<uint8_t>(static_cast<uint8_t*>(r.tensor),
                                       r.item.raw_size())));
      continue;
    }
    if (r.item.raw_size() == 0) continue;
    // The bound, not the half: halves are rounded up to whole pages.
    const int64_t per_half = static_cast<int64_t>(
        std::min(staging->half(), half_bound) / std::max<size_t>(width, 1));
    for (const snapshot::Slab& slab :
         snapshot::ContiguousSlabs(want, per_half)) {
      const uint64_t bytes = static_cast<uint64_t>(slab.box.elements()) * width;
      ASSIGN_OR_RETURN(uint8_t * area, staging->Fill(sent));
      RETURN_IF_ERROR(
          assemble(slab.box, slab.first, absl::Span<uint8_t>(area, bytes)));
      RETURN_IF_ERROR(device_->CopyFromHost(
          area, static_cast<uint8_t*>(r.tensor) + slab.first * width, bytes));
      RETURN_IF_ERROR(staging->Send(sent++));
    }
  }
  return staging != nullptr ? staging->Finish() : absl::OkStatus();
}
}  // namespace ckpt::client
