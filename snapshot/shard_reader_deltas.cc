// ShardReader's XOR deltas (format 5): a delta chunk's base chunk read
// through a reader of the shard it is a delta against, a window at a time,
// then the delta decoded and XORed with it (DecodePiece).
#include <algorithm>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "io/aligned_buffer.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_reader_piece.h"

namespace ckpt::snapshot {

absl::StatusOr<ShardReader*> ShardReader::DeltaBaseOf(uint32_t index) {
  Source& source = sources_[index];
  if (source.shard != nullptr) return source.shard.get();
  if (!source.shard_status.ok()) return source.shard_status;
  const proto::BaseShard& base = manifest_.bases(static_cast<int>(index) - 1);
  ShardReaderOptions options = options_;
  options.pool = pool();  // its reads block this thread, not the pool's
  absl::StatusOr<std::string> path = BasePath(index);
  absl::StatusOr<std::unique_ptr<ShardReader>> shard =
      path.ok() ? Open(fs_, *path, options) : path.status();
  if (shard.ok()) {
    const std::string& bytes = (*shard)->manifest_bytes();
    const uint64_t xxh3 = Checksum(
        {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    if (xxh3 != base.manifest_xxh3()) {
      shard = absl::DataLossError(absl::StrFormat(
          "is not the shard this one was saved against: its manifest "
          "checksum is %016x, expected %016x",
          xxh3, base.manifest_xxh3()));
    }
  }
  if (!shard.ok()) {
    source.shard_status = absl::DataLossError(
        absl::StrCat("the shard of step ", base.step(),
                     " that chunks here are XOR deltas against: ",
                     shard.status().message()));
    return source.shard_status;
  }
  source.shard = *std::move(shard);
  return source.shard.get();
}

absl::Status ShardReader::ReadDeltas(std::vector<Piece>& deltas,
                                     std::vector<absl::Status>* errors) {
  const size_t window = std::max<size_t>(
      2, 2 * options_.read_window_bytes / manifest_.chunk_size());
  // Base chunks' bytes, in buffers kept across windows (and calls): pages
  // faulted once, not per chunk.
  if (delta_buffers_ == nullptr) {
    delta_buffers_ =
        std::make_unique<io::BufferPool>(manifest_.chunk_size(), window);
  }
  std::vector<io::AlignedBuffer> base_raw(window);
  for (size_t start = 0; start < deltas.size(); start += window) {
    const size_t n = std::min(window, deltas.size() - start);
    // The batch's base chunks, read from each shard they are deltas against.
    std::map<uint32_t, std::vector<size_t>> by_base;
    for (size_t i = 0; i < n; ++i) {
      const Piece& p = deltas[start + i];
      by_base[p.item->chunks(p.chunk_index).xor_base()].push_back(i);
    }
    std::vector<Piece> ready;
    for (const auto& [index, members] : by_base) {
      std::vector<BaseChunkRead> reads;
      for (size_t i : members) {
        const Piece& p = deltas[start + i];
        if (base_raw[i].capacity() == 0)
          base_raw[i] = delta_buffers_->Acquire();
        reads.push_back(
            {p.item_index, p.chunk_index, p.item,
             base_raw[i].span().first(p.item->chunks(p.chunk_index).raw_size()),
             absl::OkStatus()});
      }
      absl::StatusOr<ShardReader*> base = DeltaBaseOf(index);
      if (base.ok()) (*base)->ReadBaseChunks(reads);
      for (size_t j = 0; j < members.size(); ++j) {
        Piece& p = deltas[start + members[j]];
        const absl::Status& st = base.ok() ? reads[j].status : base.status();
        if (st.ok()) {
          p.xor_with = base_raw[members[j]].data();
          ready.push_back(p);
          continue;
        }
        absl::Status e =
            InContext(SourceOf(p.item->chunks(p.chunk_index).base()), p, st);
        if (errors == nullptr) return e;
        errors->push_back(std::move(e));
      }
    }
    RETURN_IF_ERROR(ReadStored(ready, errors));
  }
  return absl::OkStatus();
}

void ShardReader::ReadBaseChunks(std::vector<BaseChunkRead>& reads) {
  std::vector<Piece> pieces;
  std::vector<size_t> of;
  for (size_t i = 0; i < reads.size(); ++i) {
    BaseChunkRead& r = reads[i];
    const proto::ChunkInfo& want = r.item->chunks(r.chunk_index);
    const proto::Item* item =
        r.item_index < static_cast<uint32_t>(manifest_.items_size())
            ? &manifest_.items(static_cast<int>(r.item_index))
            : nullptr;
    if (item == nullptr || item->name() != r.item->name() ||
        r.chunk_index >= static_cast<uint32_t>(item->chunks_size()) ||
        item->chunks(r.chunk_index).raw_offset() != want.raw_offset() ||
        item->chunks(r.chunk_index).raw_size() != want.raw_size() ||
        item->chunks(r.chunk_index).xor_depth() + 1 != want.xor_depth()) {
      r.status = absl::DataLossError(absl::StrCat(
          "its XOR delta base ", path_, " holds no chunk ", r.chunk_index,
          " of item \"", r.item->name(), "\" at item position ", r.item_index,
          " at delta depth ", want.xor_depth() - 1));
      continue;
    }
    pieces.push_back(Piece{item, r.item_index, r.chunk_index, 0, r.out});
    of.push_back(i);
  }
  // One error for the chunks asked together: a base read fails whole.
  absl::Status s = ReadPieces(pieces, nullptr);
  if (!s.ok()) {
    for (size_t i : of) {
      reads[i].status = absl::Status(
          s.code(), absl::StrCat("reading its XOR delta base: ", s.message()));
    }
  }
}

}  // namespace ckpt::snapshot
