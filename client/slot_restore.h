// Restoring from a memory-tier slot. The slot is the daemon's (a retention
// may hand it to another save meanwhile), so what is copied out of it is
// checked against the persisted manifest's chunk checksums, or the hashes
// the saving client took, on several threads.
//
// Thread-safety: as RestoreContext's; the functions run threads of their own.
#ifndef CKPT_CLIENT_SLOT_RESTORE_H_
#define CKPT_CLIENT_SLOT_RESTORE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "client/restore_context.h"
#include "proto/catalog.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

// Copies every registered item of `ctx` (`sources`: their places in the
// slot, in the items' order) chunk by chunk on several threads, checking
// each chunk where it landed (host memory, or for device tensors the pinned
// buffer they then leave for the device from; client/device_upload.h)
// against the raw checksum of the persisted manifest (`reader`), or when it
// is null (not persisted yet) against the hashes the saving client took
// (StagedItem.chunk_xxh3).
absl::Status CopyAndVerify(const RestoreContext& ctx, const uint8_t* slot,
                           const std::vector<const proto::StagedItem*>& sources,
                           const snapshot::ShardReader* reader);

// Checks the slot's items against the raw chunk checksums of the persisted
// manifest (`reader`), or when it is null (not persisted yet) against the
// hashes the saving client took of the slot (items without: not checked).
absl::Status VerifySlot(const uint8_t* slot,
                        const std::vector<const proto::StagedItem*>& sources,
                        const snapshot::ShardReader* reader);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_SLOT_RESTORE_H_
