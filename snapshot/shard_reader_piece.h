// ShardReader's internals shared by its files: one chunk to read and where
// its bytes go.
#ifndef CKPT_SNAPSHOT_SHARD_READER_PIECE_H_
#define CKPT_SNAPSHOT_SHARD_READER_PIECE_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::snapshot {

struct ShardReader::Piece {
  const proto::Item* item;
  uint32_t item_index;
  uint32_t chunk_index;
  // Bytes [begin, begin + out.size()) of the chunk's raw bytes go to `out`.
  uint64_t begin;
  absl::Span<uint8_t> out;
  absl::Status status;
  // An XOR delta: its base chunk's raw bytes, whole (ReadDeltas).
  const uint8_t* xor_with = nullptr;
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARD_READER_PIECE_H_
