// CodecGovernor chooses, chunk by chunk, how hard the persist pipeline
// compresses, so that compressing never makes a persist slower than writing
// the raw bytes would, while compressing as much as that allows.
//
// Its one control variable is the effort x in [0, max_effort]:
//   x < 1      a fraction x of the chunks is compressed at the base zstd
//              level, the others are stored raw (hashed and written from where
//              they lie, no copy);
//   x = 1      every chunk at the base level;
//   1 < x      every chunk, a fraction of them one or more levels higher (up
//              to the base level + max_effort - 1).
// Fractions are dithered (an accumulator, not a random draw), so the chunks
// of a shard follow x closely.
//
// The writer, which writes encoded chunks in file order, tells the governor
// each time it needs the next chunk what it found (Observe):
//   kAhead        the chunk was encoded already: the encoders keep ahead of
//                 the disk, so they can afford more work: x rises;
//   kDiskBusy     the writer waits for the encoders, but the disk still has
//                 queued writes to work on: x stays;
//   kDiskStarved  the writer waits and the disk has (almost) nothing queued:
//                 compression is what the persist waits for: x falls.
// One governor is meant to serve every shard written to one disk, so what it
// learnt carries over from one persist to the next.
//
// Thread-safety: thread-safe; encoding threads call Choose, writers Observe.
#ifndef CKPT_SNAPSHOT_CODEC_GOVERNOR_H_
#define CKPT_SNAPSHOT_CODEC_GOVERNOR_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace ckpt::snapshot {

struct CodecGovernorOptions {
  // The zstd level at effort 1.
  int base_level = 1;
  // The largest effort; 1 never raises the level above base_level.
  double max_effort = 1.0;
  // Where a new governor starts: 1 compresses every chunk, as a persist
  // without a governor does.
  double initial_effort = 1.0;
  // Change of x per observation.
  double step_up = 0.05;
  double step_down = 0.1;
  // The disk counts as starved while fewer than this many bytes of writes are
  // queued when the writer starts waiting.
  uint64_t starved_below_bytes = 8 << 20;
};

// What one chunk gets.
struct CodecChoice {
  bool compress = true;
  int level = 1;
};

class CodecGovernor {
 public:
  enum class Signal { kAhead, kDiskBusy, kDiskStarved };

  struct Stats {
    double effort = 1.0;
    uint64_t compressed = 0;    // chunks given to the compressor
    uint64_t stored_raw = 0;    // chunks the governor chose to store raw
    uint64_t starved = 0;       // kDiskStarved observations
    uint64_t observations = 0;  // all of them
  };

  explicit CodecGovernor(const CodecGovernorOptions& options);
  CodecGovernor(const CodecGovernor&) = delete;
  CodecGovernor& operator=(const CodecGovernor&) = delete;

  // The codec for the next chunk.
  CodecChoice Choose();
  void Observe(Signal signal);
  // kDiskBusy or kDiskStarved, from the bytes the disk has queued.
  Signal Waiting(uint64_t pending_write_bytes) const {
    return pending_write_bytes >= options_.starved_below_bytes
               ? Signal::kDiskBusy
               : Signal::kDiskStarved;
  }

  Stats stats() const;
  const CodecGovernorOptions& options() const { return options_; }

 private:
  const CodecGovernorOptions options_;
  mutable absl::Mutex mu_;
  double effort_ ABSL_GUARDED_BY(mu_);
  // Dithering accumulators: whether to compress (x < 1), whether to go one
  // level up (x > 1).
  double compress_credit_ ABSL_GUARDED_BY(mu_) = 0;
  double level_credit_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_CODEC_GOVERNOR_H_
