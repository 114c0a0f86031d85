// ShardRestorer restores a rank's registered items from its own shard of a
// step, saved by the same number of ranks with the same boxes: from the
// memory tier's slot (each chunk checked where it lands), else the shard
// file ckptd names (verified as it is read), else the same boxes saved by
// other ranks (replicated state, through a Resharder). A shard on no tier of
// this node streams from a peer straight into place (FromPeerStream). One
// ShardRestorer per restore.
//
// Thread-safety: one thread (the one calling Checkpointer::Restore).
#ifndef CKPT_CLIENT_SHARD_RESTORER_H_
#define CKPT_CLIENT_SHARD_RESTORER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/restore_context.h"
#include "proto/catalog.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

class ShardRestorer {
 public:
  // `what` ("restoring job J step S rank R") starts every error.
  ShardRestorer(RestoreContext ctx, std::string what);

  // Restores from the copies ckptd names; `vanished` when they were gone by
  // the time they were read (retention dropped them: ask again). When the
  // same tensors were saved with other boxes, reshards.
  absl::Status Restore(uint64_t step, uint32_t saved_world, bool* vanished);
  // Restores a shard on no tier of this node, as saved (same boxes), by
  // streaming its file from a peer straight into the registered memory
  // (proto PeerShardOffer); FailedPrecondition or NotFound when that does
  // not apply. A failure may leave the registered memory half written.
  absl::Status FromPeerStream(uint64_t step);

 private:
  // What ckptd knows of this rank's shard of `step`.
  absl::StatusOr<proto::ShardRecord> Describe(uint64_t step);
  // The registered items' places in the saved shard, each described alike;
  // nullopt when the same tensors were saved with other boxes (a reshard).
  absl::StatusOr<std::optional<std::vector<const proto::StagedItem*>>>
  MatchSaved(const proto::ShardRecord& shard) const;
  // The shard's file, opened (its manifest read), or why not.
  struct ShardFile {
    std::unique_ptr<snapshot::ShardReader> reader;
    absl::Status status = absl::NotFoundError("no shard file");
  };
  ShardFile OpenShardFile(const proto::ShardRecord& shard);
  // From the shard's slot, verified against `reader`'s checksums (null: the
  // saving client's hashes).
  absl::Status FromSlot(const proto::ShardRecord& shard,
                        const std::vector<const proto::StagedItem*>& sources,
                        const snapshot::ShardReader* reader);
  absl::Status FromShardFile(const proto::ShardRecord& shard,
                             const ShardFile& file, bool* vanished);
  // This rank's copy is `lost`: from other ranks that saved the same boxes.
  absl::Status FromOtherRanks(uint64_t step, uint32_t saved_world,
                              const absl::Status& lost);

  const RestoreContext ctx_;
  const std::string what_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_SHARD_RESTORER_H_
