// Checkpointer is libckpt's C++ API, linked into each trainer rank. It talks to
// the node's ckptd only through the local API (gRPC over the daemon's unix
// socket) and the staging files:
//
//   auto ckpt = Checkpointer::Connect({.job = "llama", .rank = r, .world_size =
//   n}); ckpt->RegisterTensor("w", DTYPE_FLOAT32, w.data(), {N}, {r * N / n},
//   {N / n}); ckpt->RegisterBytes("rng", &rng_state); auto save =
//   ckpt->SaveAsync(step);      // reserves a slot, copies in the background
//   save->WaitStaged();                     // state may be mutated again
//   save->WaitCommitted(TIER_LOCAL_DISK);   // optional: durable on disk for
//   every rank ckpt->Restore(*ckpt->LatestCommitted());
//
// A failed save never throws or aborts: its error comes back from
// WaitStaged/WaitCommitted and from the next SaveAsync (LastSaveError), and
// training goes on.
//
// Thread-safety: one thread drives a Checkpointer; SaveHandles may be waited on
// from any thread.
#ifndef CKPT_CLIENT_CHECKPOINTER_H_
#define CKPT_CLIENT_CHECKPOINTER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "io/thread_pool.h"
#include "kernels/device.h"
#include "proto/catalog.pb.h"

namespace ckpt::client {

struct CheckpointerOptions {
  std::string job;
  uint32_t rank = 0;
  uint32_t world_size = 1;
  // The daemon's socket; by default ckptd's default for this uid.
  std::string socket_path;
  absl::Duration rpc_timeout = absl::Seconds(30);
};

class SaveHandle {
 public:
  uint64_t step() const { return step_; }
  // Returns once the state is copied into the slot (and the daemon owns it), or
  // the save failed.
  absl::Status WaitStaged();
  // Waits until every rank's shard of the step reached `tier`.
  absl::Status WaitCommitted(proto::Tier tier = proto::TIER_LOCAL_DISK,
                             absl::Duration timeout = absl::Minutes(10));

 private:
  friend class Checkpointer;
  SaveHandle(class Checkpointer* owner, uint64_t step)
      : owner_(owner), step_(step) {}
  void Copied(absl::Status status);
  void Finish(absl::Status status);

  class Checkpointer* const owner_;
  const uint64_t step_;
  absl::Mutex mu_;
  bool copied_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status copy_status_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class Checkpointer {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpointer>> Connect(
      const CheckpointerOptions& options);
  ~Checkpointer();

  // Registers a tensor in host memory (the CPU device): this rank's box of a
  // global tensor, row-major. The memory must stay valid while the Checkpointer
  // lives.
  absl::Status RegisterTensor(const std::string& name, proto::DType dtype,
                              void* data, std::vector<int64_t> global_shape,
                              std::vector<int64_t> box_offset,
                              std::vector<int64_t> box_length);
  // Registers an opaque byte item (RNG state, data-loader position); read at
  // every save, replaced at restore.
  absl::Status RegisterBytes(const std::string& name, std::string* value);

  // Starts saving `step`. The copy runs in the background; see SaveHandle.
  absl::StatusOr<std::shared_ptr<SaveHandle>> SaveAsync(uint64_t step);
  // The error of the most recent save that failed since the last call (then
  // cleared).
  absl::Status LastSaveError();

  // The newest step committed at `tier` for this job.
  absl::StatusOr<absl::optional<uint64_t>> LatestCommitted(
      proto::Tier tier = proto::TIER_LOCAL_DISK);
  // Restores every registered item from `step` (same world size and boxes as
  // saved), from the memory tier when the slot is still there, else from the
  // persisted shard (verified).
  absl::Status Restore(uint64_t step);

  // What the daemon knows about this rank's shard of `step` (state, sizes,
  // timestamps).
  absl::StatusOr<proto::ShardRecord> DescribeShard(uint64_t step);

  const CheckpointerOptions& options() const { return options_; }

 private:
  friend class SaveHandle;
  struct Registered;
  class Rpc;
  explicit Checkpointer(const CheckpointerOptions& options);
  void RecordFailure(const absl::Status& status);
  // The name is valid and not registered yet.
  absl::Status CheckNewName(const std::string& name) const;
  // Waits for the copy in flight and every queued hand-over.
  void DrainHandovers();

  const CheckpointerOptions options_;
  std::unique_ptr<Rpc> rpc_;
  std::unique_ptr<kernels::Device> device_;
  std::vector<Registered> items_;
  std::thread copier_;  // the copy of the save in flight
  // One thread: StageComplete/AbortStage calls, in save order.
  std::unique_ptr<io::ThreadPool> handover_;
  absl::Mutex mu_;
  absl::Status last_failure_ ABSL_GUARDED_BY(mu_);
};

// ckptd's default socket for the calling uid.
std::string DefaultSocketPath();

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_CHECKPOINTER_H_
