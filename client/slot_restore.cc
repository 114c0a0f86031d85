#include "client/slot_restore.h"

#include <algorithm>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/device_upload.h"
#include "client/parallel_copy.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {
namespace {
// Whether the saving client hashed the item's chunks (one hash per chunk).
bool HasChunkHashes(const proto::StagedItem& staged) {
  return staged.chunk_xxh3_size() > 0 &&
         static_cast<uint64_t>(staged.chunk_xxh3_size()) ==
             snapshot::ChunkCount(staged.item().raw_size(),
                                  staged.chunk_size());
}

// A run of an item copied from the slot and checked: against the persisted
// manifest's chunk checksum, else the hash the saving client took of the run
// in the slot (StagedItem.chunk_xxh3). Neither (a save that took no hashes,
// not persisted yet): nothing to check.
struct CopyUnit {
  const uint8_t* src;
  uint8_t* dst;
  uint64_t bytes;
  std::optional<uint64_t> xxh3;
  const proto::StagedItem* staged;
  int chunk;
  bool on_device;  // dst is device memory
};

// Where registered item `i` lands: its tensor, or its byte string resized.
uint8_t* DestinationOf(const RestoreContext& ctx, size_t i, uint64_t n) {
  if (ctx.items[i].is_tensor())
    return static_cast<uint8_t*>(ctx.items[i].tensor);
  ctx.items[i].bytes->resize(n);
  return reinterpret_cast<uint8_t*>(ctx.items[i].bytes->data());
}

// The units of registered item `i`, staged as `staged`: the persisted
// chunks when `reader` has them, else the hashed runs of the save, else
// pieces of 4 MiB. Adds its tensor bytes to `tensor_bytes`.
absl::Status AddUnits(const RestoreContext& ctx, size_t i, const uint8_t* slot,
                      const proto::StagedItem& staged,
                      const snapshot::ShardReader* reader,
                      std::vector<CopyUnit>* units, uint64_t* tensor_bytes) {
  const uint8_t* src = slot + staged.slot_offset();
  const uint64_t n = staged.item().raw_size();
  const bool on_device =
      ctx.items[i].is_tensor() && !ctx.device.host_resident();
  if (ctx.items[i].is_tensor()) *tensor_bytes += n;
  if (reader != nullptr) {
    ASSIGN_OR_RETURN(const proto::Item* item,
                     reader->FindItem(staged.item().name()));
    if (item->raw_size() != n) {
      return absl::DataLossError(absl::StrCat(
          "item \"", item->name(), "\" has ", n, " bytes in the slot but ",
          item->raw_size(), " in ", reader->path()));
    }
    uint8_t* dst = DestinationOf(ctx, i, n);
    for (int c = 0; c < item->chunks_size(); ++c) {
      const proto::ChunkInfo& chunk = item->chunks(c);
      if (chunk.raw_offset() > n || chunk.raw_size() > n - chunk.raw_offset()) {
        return absl::DataLossError(absl::StrCat(
            "chunk ", c, " of item \"", item->name(), "\" lies outside it"));
      }
      units->push_back({src + chunk.raw_offset(), dst + chunk.raw_offset(),
                        chunk.raw_size(), chunk.raw_xxh3(), &staged, c,
                        on_device});
    }
    return absl::OkStatus();
  }
  uint8_t* dst = DestinationOf(ctx, i, n);
  const bool hashed = HasChunkHashes(staged);
  const uint64_t piece = hashed ? staged.chunk_size() : uint64_t{4} << 20;
  int c = 0;
  for (uint64_t off = 0; off < n; off += piece, ++c) {
    units->push_back(
        {src + off, dst + off, std::min(piece, n - off),
         hashed ? std::optional<uint64_t>(staged.chunk_xxh3(c)) : std::nullopt,
         &staged, c, on_device});
  }
  return absl::OkStatus();
}

absl::Status Mismatch(const CopyUnit& unit,
                      const snapshot::ShardReader* reader) {
  return absl::DataLossError(absl::StrCat(
      "item \"", unit.staged->item().name(), "\" chunk ", unit.chunk,
      ": the copy from the staging slot does not match ",
      reader != nullptr ? "the checksum in " + reader->path()
                        : std::string("the hash taken when it was saved")));
}

bool Landed(const CopyUnit& unit, absl::Span<const uint8_t> landed) {
  return !unit.xxh3.has_value() || snapshot::Checksum(landed) == *unit.xxh3;
}

// Host units copied on `threads` and checked in one pass: each block hashed
// right after its copy, while it is in the cache.
absl::Status CopyOnHost(const std::vector<const CopyUnit*>& units, int threads,
                        const snapshot::ShardReader* reader) {
  std::vector<absl::Status> results(units.size());
  ParallelFor(units.size(), threads, [&](size_t i) {
    const CopyUnit& unit = *units[i];
    if (!unit.xxh3.has_value()) {
      std::memcpy(unit.dst, unit.src, unit.bytes);
    } else if (CopyAndChecksum(unit.dst, unit.src, unit.bytes) != *unit.xxh3) {
      results[i] = Mismatch(unit, reader);
    }
  });
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CopyAndVerify(const RestoreContext& ctx, const uint8_t* slot,
                           const std::vector<const proto::StagedItem*>& sources,
                           const snapshot::ShardReader* reader) {
  std::vector<CopyUnit> units;
  uint64_t total = 0;
  for (size_t i = 0; i < ctx.items.size(); ++i) {
    RETURN_IF_ERROR(
        AddUnits(ctx, i, slot, *sources[i], reader, &units, &total));
  }
  // Units into device memory go through a pinned buffer, checked there.
  std::vector<const CopyUnit*> on_host, device_units;
  std::vector<HostRun> to_device;
  for (const CopyUnit& unit : units) {
    if (unit.on_device) {
      to_device.push_back({unit.src, unit.dst, unit.bytes});
      device_units.push_back(&unit);
    } else {
      on_host.push_back(&unit);
    }
  }
  RETURN_IF_ERROR(CopyOnHost(on_host, CopyThreadsFor(total), reader));
  if (to_device.empty()) return absl::OkStatus();
  return UploadFromHost(
      &ctx.device, to_device,
      [&](size_t i, absl::Span<const uint8_t> landed) {
        return Landed(*device_units[i], landed)
                   ? absl::OkStatus()
                   : Mismatch(*device_units[i], reader);
      },
      ctx.options.restore_buffer_bytes);
}

absl::Status VerifySlot(const uint8_t* slot,
                        const std::vector<const proto::StagedItem*>& sources,
                        const snapshot::ShardReader* reader) {
  // Items are checked on several threads: hashing a large slot on one core
  // would be most of a restore from memory.
  std::vector<absl::Status> results(sources.size());
  uint64_t total = 0;
  for (const proto::StagedItem* staged : sources)
    total += staged->item().raw_size();
  ParallelFor(sources.size(), CopyThreadsFor(total), [&](size_t i) {
    const proto::StagedItem* staged = sources[i];
    const uint64_t n = staged->item().raw_size();
    if (reader == nullptr) {
      // Not persisted: the hashes the saving client took, if it took any.
      if (!HasChunkHashes(*staged)) return;
      const uint64_t size = staged->chunk_size();
      int c = 0;
      for (uint64_t off = 0; off < n; off += size, ++c) {
        if (snapshot::Checksum(absl::MakeConstSpan(
                slot + staged->slot_offset() + off, std::min(size, n - off))) !=
            staged->chunk_xxh3(c)) {
          results[i] = absl::DataLossError(absl::StrCat(
              "the staging slot's item \"", staged->item().name(), "\" chunk ",
              c, " differs from the hash taken when it was saved"));
          return;
        }
      }
      return;
    }
    absl::StatusOr<const proto::Item*> item =
        reader->FindItem(staged->item().name());
    if (!item.ok()) {
      results[i] = item.status();
      return;
    }
    if ((*item)->raw_size() != n) {
      results[i] = absl::DataLossError(absl::StrCat(
          "item \"", (*item)->name(), "\" has ", n, " bytes in the slot but ",
          (*item)->raw_size(), " in ", reader->path()));
      return;
    }
    std::vector<absl::Status> bad = snapshot::VerifyRawItem(
        absl::MakeConstSpan(slot + staged->slot_offset(), n), **item,
        /*max_errors=*/1);
    if (!bad.empty()) {
      results[i] = absl::DataLossError(
          absl::StrCat("the staging slot differs from ", reader->path(), ": ",
                       bad.front().message()));
    }
  });
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}
}  // namespace ckpt::client
