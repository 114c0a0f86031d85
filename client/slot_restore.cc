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

}  // namespace

absl::Status CopyAndVerify(const RestoreContext& ctx, const uint8_t* slot,
                           const std::vector<const proto::StagedItem*>& sources,
                           const snapshot::ShardReader* reader) {
  // What each copied run must hash to: the persisted manifest's chunk
  // checksum, else the hash the saving client took of the run in the slot
  // (StagedItem.chunk_xxh3). Neither (a save that took no hashes, not
  // persisted yet): nothing to check.
  struct Unit {
    const uint8_t* src;
    uint8_t* dst;
    uint64_t bytes;
    std::optional<uint64_t> xxh3;
    const proto::StagedItem* staged;
    int chunk;
    bool on_device;  // dst is device memory
  };
  std::vector<Unit> units;
  uint64_t total = 0;
  for (size_t i = 0; i < ctx.items.size(); ++i) {
    const proto::StagedItem& staged = *sources[i];
    const uint8_t* src = slot + staged.slot_offset();
    const uint64_t n = staged.item().raw_size();
    const proto::Item* item = nullptr;
    if (reader != nullptr) {
      ASSIGN_OR_RETURN(item, reader->FindItem(staged.item().name()));
      if (item->raw_size() != n) {
        return absl::DataLossError(absl::StrCat(
            "item \"", item->name(), "\" has ", n, " bytes in the slot but ",
            item->raw_size(), " in ", reader->path()));
      }
    }
    uint8_t* dst;
    const bool on_device =
        ctx.items[i].is_tensor() && !ctx.device.host_resident();
    if (ctx.items[i].is_tensor()) {
      dst = static_cast<uint8_t*>(ctx.items[i].tensor);
      total += n;
    } else {
      ctx.items[i].bytes->resize(n);
      dst = reinterpret_cast<uint8_t*>(ctx.items[i].bytes->data());
    }
    if (item != nullptr) {
      for (int c = 0; c < item->chunks_size(); ++c) {
        const proto::ChunkInfo& chunk = item->chunks(c);
        if (chunk.raw_offset() > n ||
            chunk.raw_size() > n - chunk.raw_offset()) {
          return absl::DataLossError(absl::StrCat(
              "chunk ", c, " of item \"", item->name(), "\" lies outside it"));
        }
        units.push_back({src + chunk.raw_offset(), dst + chunk.raw_offset(),
                         chunk.raw_size(), chunk.raw_xxh3(), &staged, c,
                         on_device});
      }
      continue;
    }
    const bool hashed = HasChunkHashes(staged);
    const uint64_t piece = hashed ? staged.chunk_size() : uint64_t{4} << 20;
    int c = 0;
    for (uint64_t off = 0; off < n; off += piece, ++c) {
      units.push_back({src + off, dst + off, std::min(piece, n - off),
                       hashed ? std::optional<uint64_t>(staged.chunk_xxh3(c))
                              : std::nullopt,
                       &staged, c, on_device});
    }
  }
  auto mismatch = [&](const Unit& unit) {
    return absl::DataLossError(absl::StrCat(
        "item \"", unit.staged->item().name(), "\" chunk ", unit.chunk,
        ": the copy from the staging slot does not match ",
        reader != nullptr ? "the checksum in " + reader->path()
                          : std::string("the hash taken when it was saved")));
  };
  auto good = [](const Unit& unit, absl::Span<const uint8_t> landed) {
    return !unit.xxh3.has_value() || snapshot::Checksum(landed) == *unit.xxh3;
  };
  // Units into device memory go through a pinned buffer, checked there.
  std::vector<size_t> on_host;
  std::vector<HostRun> to_device;
  std::vector<const Unit*> device_units;
  for (size_t u = 0; u < units.size(); ++u) {
    if (units[u].on_device) {
      to_device.push_back({units[u].src, units[u].dst, units[u].bytes});
      device_units.push_back(&units[u]);
    } else {
      on_host.push_back(u);
    }
  }
  std::vector<absl::Status> results(on_host.size());
  ParallelFor(on_host.size(), CopyThreadsFor(total), [&](size_t i) {
    const Unit& unit = units[on_host[i]];
    std::memcpy(unit.dst, unit.src, unit.bytes);
    if (!good(unit, absl::MakeConstSpan(unit.dst, unit.bytes))) {
      results[i] = mismatch(unit);
    }
  });
  for (absl::Status& s : results) {
    if (!s.ok()) return s;
  }
  if (to_device.empty()) return absl::OkStatus();
  return UploadFromHost(
      &ctx.device, to_device,
      [&](size_t i, absl::Span<const uint8_t> landed) {
        return good(*device_units[i], landed) ? absl::OkStatus()
                                              : mismatch(*device_units[i]);
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
