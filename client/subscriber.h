// Readers of published versions (issue #37): a rollout or inference engine
// waits for a topic's next version, opens it on its node's ckptd, and reads
// whole tensors out of it, assembled from every rank's box; and the call
// that publishes a committed step (`ckpt publish`, a trainer after a save).
//
// A version opened stays readable while its PublishedVersion lives, even
// after ckptd dropped it for newer ones: its files are open here. ckptd
// placed it only once every chunk verified; Read maps the chunks stored in
// place (every chunk of 64 KiB or more of a version) and copies out of the
// mapping, and checks the others against their checksums as it reads them.
// View gives a tensor's bytes without a copy.
//
// Thread-safety: Subscriber and PublishedVersion are thread-safe.
#ifndef CKPT_CLIENT_SUBSCRIBER_H_
#define CKPT_CLIENT_SUBSCRIBER_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/item_view.h"
#include "io/unique_fd.h"
#include "proto/publish.grpc.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

// Makes the next version of `request.topic` from a committed step, through
// the ckptd at `socket_path` (which must hold every rank's shard).
absl::StatusOr<proto::VersionRecord> Publish(
    const std::string& socket_path, const proto::PublishRequest& request);

// The topics the ckptd at `socket_path` knows, with their newest versions.
absl::StatusOr<proto::ListTopicsResponse> ListTopics(
    const std::string& socket_path);

// Makes the node of the ckptd at `socket_path` a subscriber of `topic`: it
// fetches each new version from its peers. False: it was one already.
absl::StatusOr<bool> Subscribe(const std::string& socket_path,
                               const std::string& topic);

// An item of a version as a whole: a tensor's global shape, or a byte
// string.
struct PublishedItem {
  std::string name;
  bool is_tensor = false;
  proto::DType dtype = proto::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;  // global
  uint64_t bytes = 0;          // of the whole item
};

class PublishedVersion {
 public:
  const proto::VersionRecord& record() const { return record_; }
  uint64_t version() const { return record_.version(); }
  // Every item, in the order of rank 0's file (then items only later ranks
  // have).
  const std::vector<PublishedItem>& items() const { return items_; }
  // NotFound names the item and the version.
  absl::StatusOr<PublishedItem> Find(const std::string& name) const;
  // Reads item `name` whole into `out` (PublishedItem::bytes): a tensor
  // assembled row-major from every rank's box, a byte item from the first
  // rank that has it. InvalidArgument when `out` has another size; DataLoss
  // when a chunk does not match its checksum, or the ranks' boxes leave part
  // of the tensor uncovered.
  absl::Status Read(const std::string& name, absl::Span<uint8_t> out);
  // Item `name` whole, mapped without a copy (private: writes to it change
  // nothing), valid while this version lives: a tensor one rank holds whole,
  // or a byte item, whose chunks are stored in place. FailedPrecondition
  // otherwise: Read it.
  absl::StatusOr<absl::Span<uint8_t>> View(const std::string& name);

 private:
  friend class Subscriber;
  absl::Status Index();
  // `rank`'s box of item `name`, mapped (made once, kept); nullptr when its
  // chunks are not stored in place.
  absl::StatusOr<ItemView*> ViewOf(size_t rank, const proto::Item& item);
  // The rank whose box of `whole` is all of it (a byte item: the first that
  // has it); nullopt when it is split over ranks.
  std::optional<size_t> WholeIn(const PublishedItem& whole) const;

  proto::VersionRecord record_;
  std::vector<std::string> paths_;   // by rank
  std::vector<io::UniqueFd> files_;  // by rank, open: views map them
  std::vector<std::unique_ptr<snapshot::ShardReader>> readers_;  // by rank
  std::vector<PublishedItem> items_;
  absl::Mutex mu_;
  std::map<std::pair<size_t, std::string>, std::unique_ptr<ItemView>> views_
      ABSL_GUARDED_BY(mu_);
};

class Subscriber {
 public:
  // A reader of `topic` through the ckptd at `socket_path`.
  static absl::StatusOr<std::unique_ptr<Subscriber>> Connect(
      const std::string& socket_path, const std::string& topic);

  const std::string& topic() const { return topic_; }

  // The newest version above `after`, once there is one; DeadlineExceeded
  // after `timeout`.
  absl::StatusOr<proto::VersionRecord> WaitForVersion(uint64_t after,
                                                      absl::Duration timeout);
  // Opens version `version` (0: the newest) on this node. NotFound when the
  // node does not hold it (any more): open a newer one.
  absl::StatusOr<std::unique_ptr<PublishedVersion>> Open(uint64_t version = 0);

 private:
  Subscriber(std::string socket_path, std::string topic);

  const std::string socket_path_;
  const std::string topic_;
  std::unique_ptr<proto::CkptPublish::Stub> stub_;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_SUBSCRIBER_H_
