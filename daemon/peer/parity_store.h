// ParityStore keeps the parity blocks this node holds for the erasure-coded
// peer tier (DESIGN.md §2, T1 with `--peer-redundancy rs:K+M`), on tmpfs
// (memory) beside the replicas: block j of a parity group of a step, built by
// XORing in the contribution of each of the group's data blocks as its node
// streams it (snapshot::ErasureCode::Contribute, Accumulate). The block is
// complete, and can stand in for a lost shard, once every data block of the
// group contributed; its XXH3 is then recorded.
//
// A contribution counts once all its bytes arrived and hash to what its sender
// says. One cut short after some of its bytes were applied spoils the block:
// the block is emptied (its contributions must come again; the data nodes see
// that in its record), and contributions under way into the spoiled block fail
// (Aborted). A record beside each block names the contributions under way, so
// a block a crash cut into is dropped when the store is opened again.
//
// Layout: <dir>/<job>/<step:020>-g<group:06>-p<index:02>.parity (the block,
// as long as the group's stripe) and .record (proto ParityBlockRecord).
//
// Thread-safety: thread-safe. Contributions to one block may run at once.
#ifndef CKPT_DAEMON_PEER_PARITY_STORE_H_
#define CKPT_DAEMON_PEER_PARITY_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "io/file_system.h"
#include "proto/peer.pb.h"

struct XXH3_state_s;

namespace ckpt::daemon {

class ParityStore {
 public:
  // One data block's contribution being received and applied.
  class Contribution {
   public:
    // Unfinished after bytes were applied: the block is emptied.
    ~Contribution();
    // The next bytes, XORed into the block at once; more than the data
    // block's length is an error. Aborted once the block was emptied.
    absl::Status Append(absl::Span<const uint8_t> data);
    // Every byte arrived and they hash to `xxh3`: the contribution counts.
    // Returns the block's record (complete once every data block is in).
    absl::StatusOr<proto::ParityBlockRecord> Finish(uint64_t xxh3);

   private:
    friend class ParityStore;
    Contribution(ParityStore* store, proto::ParityBlockKey key,
                 uint32_t position, uint64_t bytes, uint64_t epoch);

    ParityStore* const store_;
    const proto::ParityBlockKey key_;
    const uint32_t position_;
    const uint64_t bytes_;
    const uint64_t epoch_;
    XXH3_state_s* hash_;
    uint64_t received_ = 0;
    bool done_ = false;
  };

  // What `ckpt verify` finds of one block in a store's directory, read
  // without opening the store (the daemon may be running): a complete block
  // must be its group's stripe long and hash to the XXH3 its record took
  // when it completed.
  struct BlockCheck {
    proto::ParityBlockKey key;
    std::string path;
    bool complete = false;
    std::vector<std::string> problems;  // empty: intact
  };
  static std::vector<BlockCheck> Verify(io::FileSystem* fs,
                                        const std::string& dir,
                                        const std::string& job,
                                        absl::optional<uint64_t> step);

  // Creates `dir` (mode 0700) if needed, drops blocks a crash cut into and
  // stray files, and adopts the rest.
  static absl::StatusOr<std::unique_ptr<ParityStore>> Open(
      io::FileSystem* fs, std::string dir, uint64_t budget_bytes);
  ~ParityStore();

  // Starts data block `position` of `group` contributing to parity block
  // `key`, creating the block (zeros, the group's stripe long) if this is
  // its first contribution. InvalidArgument for a position or index outside
  // the group; FailedPrecondition when the block exists for another group
  // (another plan of the step); AlreadyExists when the position contributed
  // already; ResourceExhausted when a new block does not fit the budget.
  absl::StatusOr<std::unique_ptr<Contribution>> Contribute(
      const proto::ParityBlockKey& key, const proto::ParityGroup& group,
      uint32_t position);
  // NotFound when this node has no such block.
  absl::StatusOr<proto::ParityBlockRecord> Record(
      const proto::ParityBlockKey& key) const;
  // A complete block, mapped for reading, with its record.
  // FailedPrecondition when it is not complete.
  struct Complete {
    std::unique_ptr<io::MappedFile> map;
    std::string path;
    proto::ParityBlockRecord record;
  };
  absl::StatusOr<Complete> OpenComplete(const proto::ParityBlockKey& key);
  // Every block's record, of `job` (every job when empty).
  std::vector<proto::ParityBlockRecord> List(const std::string& job = "") const;
  // Deletes a block; NotFound if there is none.
  absl::Status Drop(const proto::ParityBlockKey& key);

  uint64_t used_bytes() const;
  uint64_t budget_bytes() const { return budget_; }

 private:
  using Key = std::tuple<std::string, uint64_t, uint32_t, uint32_t>;
  static Key KeyOf(const proto::ParityBlockKey& key);
  struct Block {
    proto::ParityBlockRecord record;
    std::unique_ptr<io::MappedFile> map;  // writable
    // Which incarnation of the block this is: a new one each time it is
    // created or emptied, unique in the store.
    uint64_t epoch = 0;
  };
  ParityStore(io::FileSystem* fs, std::string dir, uint64_t budget)
      : fs_(fs), dir_(std::move(dir)), budget_(budget) {}
  std::string PathOf(const proto::ParityBlockKey& key,
                     absl::string_view suffix) const;
  absl::Status WriteRecord(const proto::ParityBlockRecord& record)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A fresh block of zeros in place of `b`'s bytes; its contributions are
  // forgotten and those under way fail.
  absl::Status Empty(Block& b) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The block of `c`, when it was not emptied since `c` began.
  Block* Current(const Contribution& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Abandon(Contribution& c);

  io::FileSystem* const fs_;
  const std::string dir_;
  const uint64_t budget_;
  mutable absl::Mutex mu_;
  std::map<Key, Block> blocks_ ABSL_GUARDED_BY(mu_);
  uint64_t used_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_epoch_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PARITY_STORE_H_
