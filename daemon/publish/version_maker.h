// VersionMaker: one version's files made from a committed step on this node
// (Publisher::Publish), rank by rank, in a directory of their own in the
// version store: the items the request's globs choose, float32 cast to
// bfloat16 when asked (bit-identical to torch's `.to(torch.bfloat16)`),
// stored raw and page aligned so readers map them. Room in the store's
// budget is reserved before any file is written. The files are removed
// unless the version was placed.
//
// Thread-safety: one thread.
#ifndef CKPT_DAEMON_PUBLISH_VERSION_MAKER_H_
#define CKPT_DAEMON_PUBLISH_VERSION_MAKER_H_

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "daemon/publish/version_store.h"
#include "io/aligned_buffer.h"
#include "io/file_system.h"
#include "proto/publish.pb.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"

namespace ckpt::daemon {

class VersionMaker {
 public:
  VersionMaker(io::FileSystem* fs, VersionStore* store, std::string node_id,
               const proto::PublishRequest& request, std::string what)
      : fs_(fs),
        store_(store),
        node_id_(std::move(node_id)),
        request_(request),
        what_(std::move(what)) {}

  // Removes the files unless they were placed.
  ~VersionMaker() {
    if (!dir_.empty() && !placed_) store_->RemoveDir(dir_);
  }

  // Opens every rank's shard (`sources[rank]`) and reserves room for the
  // version's files in the store's budget, about as many bytes as the chosen
  // items take, cast.
  absl::Status Open(const std::vector<std::string>& sources);

  // Every rank's file; the version's record, not yet numbered.
  // InvalidArgument when no item was chosen; ResourceExhausted when the
  // files take more room than the budget has.
  absl::StatusOr<proto::VersionRecord> MakeFiles(absl::Time start);

  // The names chosen in any rank.
  const std::set<std::string>& chosen() const { return chosen_; }

  // The version, numbered, goes into place.
  absl::Status Place(const proto::VersionRecord& numbered);

 private:
  absl::Status OfRank(uint32_t rank, const absl::Status& s) const;

  // A file's manifest and seal, about.
  static constexpr uint64_t kFileOverhead = 64 << 10;

  // What `item` takes in a version's file, about: cast, each chunk page
  // aligned.
  uint64_t StoredBytes(const proto::Item& item) const;

  // Rank `rank`'s file: the chosen items, cast.
  absl::StatusOr<proto::VersionFile> MakeRankFile(uint32_t rank);

  bool Chosen(const std::string& name) const;

  // The item as read into kept.back(), cast when asked.
  absl::Status Add(snapshot::ShardWriter& writer, const proto::Item& item,
                   std::vector<io::AlignedBuffer>& kept);

  io::FileSystem* const fs_;
  VersionStore* const store_;
  const std::string node_id_;
  const proto::PublishRequest& request_;
  const std::string what_;
  std::vector<std::unique_ptr<snapshot::ShardReader>> readers_;  // by rank
  std::unique_ptr<VersionStore::Room> room_;
  std::string dir_;
  std::set<std::string> chosen_;
  bool placed_ = false;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PUBLISH_VERSION_MAKER_H_
