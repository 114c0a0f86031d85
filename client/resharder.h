// Resharder restores a rank's registered items from a step saved by another
// number of ranks, or with other boxes: every saved rank's shard is
// described through ckptd; each tensor's box is assembled from the saved
// boxes it overlaps, one replica of each (data-parallel state saved by
// several ranks), the next one when it fails, reading only the overlapping
// byte ranges of files; device tensors go up in slabs through pinned halves;
// a byte item comes from the saved rank with this rank's number, else from
// another. One Resharder per restore.
//
// Thread-safety: one thread (the one calling Checkpointer::Restore).
#ifndef CKPT_CLIENT_RESHARDER_H_
#define CKPT_CLIENT_RESHARDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/device_upload.h"
#include "client/restore_context.h"
#include "io/file_system.h"
#include "proto/catalog.pb.h"
#include "snapshot/box.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

class Resharder {
 public:
  // `what` ("restoring job J step S rank R") starts every error.
  // Replicas in `avoided` are not read (the minority of a suspect step's
  // replicas: the box's majority holds it too).
  Resharder(RestoreContext ctx, std::string what, ReplicasAvoided avoided = {});

  // Restores every registered item from `step`, saved by `saved_world`
  // ranks.
  absl::Status Restore(uint64_t step, uint32_t saved_world);

 private:
  // One saved rank's shard: its description always, its bytes (a verified
  // slot, else the file) once a registered item overlaps it.
  struct SavedRank {
    proto::ShardRecord shard;
    bool opened = false;
    absl::Status open_status;  // of the first Open
    std::unique_ptr<snapshot::ShardReader> reader;
    std::unique_ptr<io::MappedFile> slot;  // usable: verified, or not persisted
    const proto::StagedItem* Find(const std::string& name) const;
  };
  // A saved box that overlaps a tensor being resharded, and the saved ranks
  // that hold it (replicas of each other), in the order they are tried.
  struct SavedBox {
    struct Replica {
      SavedRank* rank;
      const proto::StagedItem* staged;
    };
    snapshot::Box box;
    std::vector<Replica> replicas;
  };

  // Every saved rank's shard, described by ckptd; one ckptd refused (its
  // copies damaged or unsealed) is kept as unreadable.
  absl::Status DescribeSavedRanks(uint64_t step, uint32_t saved_world);
  // The pinned halves device tensors are assembled in: a tensor as a whole,
  // or, when larger than a half, in slabs that fit one.
  absl::Status PinHalves();
  absl::Status RestoreBytes(RegisteredItem& r);
  // The saved boxes overlapping `r`'s box, grouped by box, each group's
  // replicas in the order they are tried.
  absl::StatusOr<std::vector<SavedBox>> SavedBoxesOf(const RegisteredItem& r);
  // Copies the overlap of saved `box` (`staged` in `from`) with `want`, laid
  // out in `dst`; returns the elements copied.
  absl::StatusOr<int64_t> CopyOverlap(const RegisteredItem& r,
                                      const snapshot::Box& box, SavedRank& from,
                                      const proto::StagedItem& staged,
                                      const snapshot::Box& want,
                                      absl::Span<uint8_t> dst);
  // Fills `dst`, laid out over `part_box` (the rank's box or a slab of it
  // starting at element `first`), from every saved box overlapping it.
  absl::Status AssembleBox(const RegisteredItem& r,
                           const std::vector<SavedBox>& boxes,
                           const snapshot::Box& part_box, int64_t first,
                           absl::Span<uint8_t> dst);
  absl::Status Upload(RegisteredItem& r, const std::vector<SavedBox>& boxes);
  // Opens a saved rank's bytes: its slot if it verifies (or is not persisted
  // yet), else its shard file. The first outcome is kept.
  absl::Status Open(SavedRank& saved);
  absl::Status OpenOnce(SavedRank& saved);

  const RestoreContext ctx_;
  const std::string what_;
  const ReplicasAvoided avoided_;
  std::vector<SavedRank> saved_;           // by saved rank
  std::vector<uint8_t> scratch_;           // a saved item's bytes from a file
  std::unique_ptr<PinnedHalves> staging_;  // device tensors only
  uint64_t half_bound_ = 0;                // the most of a half a slab fills
  size_t sent_ = 0;                        // halves sent to the device so far
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_RESHARDER_H_
