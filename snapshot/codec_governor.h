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
// It steers by the throughput it is there to protect. Chunks are chosen in
// windows of `window_bytes` raw bytes; a window's chunks all get its effort.
// Writers report each chunk they hand to the disk (Written): the time since
// their previous report, i.e. what the chunk cost end to end (compressing,
// waiting for the disk, and for a persist's last chunk the final drain). Once
// every chunk of a window is reported, its rate r is known. A window at effort
// 0 measures the raw rate R: window 2 is such a probe, and one every
// `probe_every` windows after, to keep R current (the disk, the data and the
// load on the cores change). While probes find raw slower than the window
// before them (compressing wins: a slow disk, compressible data), the
// interval doubles, up to `max_probe_every`: a probe stores raw what would
// have been compressed, which on highly compressible state multiplies the
// bytes written. A probe that finds raw faster brings the interval back.
// After a window at effort x > 0 measures r:
//   r < R * (1 - tolerance)   compressing costs throughput: x becomes
//                             x * r / R;
//   otherwise                 x rises by step_up (compression keeps up with
//                             the disk, or makes the persist faster, as on a
//                             slow disk where fewer bytes win).
// The new effort applies from the next window opened. One governor is meant
// to serve every shard written to one disk, so what it learnt carries over
// from one persist to the next. Concurrent writers each report their own
// chunks; their rates average, in probe and ordinary windows alike.
//
// Thread-safety: thread-safe; encoding threads call Choose, writers Written.
#ifndef CKPT_SNAPSHOT_CODEC_GOVERNOR_H_
#define CKPT_SNAPSHOT_CODEC_GOVERNOR_H_

#include <cstdint>
#include <deque>

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
  // Raw bytes per measuring window.
  uint64_t window_bytes = 32 << 20;
  // Windows between probes of the raw rate (effort 0), the first being
  // window 2; while compressing wins, up to max_probe_every. 0: no probes,
  // the raw rate is known only from windows whose effort fell to 0.
  int probe_every = 8;
  int max_probe_every = 64;
  // How much slower than raw a window may be before the effort falls.
  double tolerance = 0.05;
  // Rise of x after a window that kept up.
  double step_up = 0.05;
};

// What one chunk gets. `window` says under which window it was chosen; the
// writer hands the choice back with its report.
struct CodecChoice {
  bool compress = true;
  int level = 1;
  uint64_t window = 0;
};

class CodecGovernor {
 public:
  struct Stats {
    double effort = 1.0;
    uint64_t compressed = 0;  // chunks given to the compressor
    uint64_t stored_raw = 0;  // chunks the governor chose to store raw
    uint64_t windows = 0;     // windows measured
    uint64_t probes = 0;      // of them, at effort 0 to measure the raw rate
    uint64_t lowered = 0;     // windows after which the effort fell
    double raw_mib_s = 0;     // the raw rate R (0: not measured yet)
    double last_mib_s = 0;    // the rate of the last window
    int probe_every = 0;      // windows from the last probe to the next
  };

  explicit CodecGovernor(const CodecGovernorOptions& options);
  CodecGovernor(const CodecGovernor&) = delete;
  CodecGovernor& operator=(const CodecGovernor&) = delete;

  // The codec for the next chunk, of `raw_bytes` raw bytes.
  CodecChoice Choose(uint64_t raw_bytes);
  // A writer handed a chunk encoded under `choice` with `raw_bytes` raw bytes
  // to the disk, `seconds` after its previous report or the start of its
  // persist. `raw_bytes` 0: time spent draining the writes at the end.
  void Written(const CodecChoice& choice, uint64_t raw_bytes, double seconds);

  Stats stats() const;
  const CodecGovernorOptions& options() const { return options_; }

 private:
  // A window: its effort, and the raw bytes chosen in it and reported of it.
  struct Window {
    uint64_t number = 0;
    double effort = 1.0;  // 0 in a probe
    bool probe = false;
    bool closed = false;  // no more chunks are chosen in it
    uint64_t chosen_bytes = 0;
    uint64_t reported_bytes = 0;
    double seconds = 0;
  };
  // Windows closed but not yet measured that are kept: a writer that failed
  // never reports the rest of its chunks.
  static constexpr size_t kMaxOpenWindows = 16;

  // Opens the next window at the current effort.
  void Open() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Adjusts the effort from a window whose every chunk was reported.
  void Measure(const Window& w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const CodecGovernorOptions options_;
  mutable absl::Mutex mu_;
  double effort_ ABSL_GUARDED_BY(mu_);
  // The window chunks are chosen in (back), and the closed ones whose chunks
  // are still being written, oldest first.
  std::deque<Window> windows_ ABSL_GUARDED_BY(mu_);
  // The next probe's window number, and the interval that set it.
  uint64_t next_probe_ ABSL_GUARDED_BY(mu_) = 2;
  int probe_every_ ABSL_GUARDED_BY(mu_) = 0;
  // The rate of the last window that was not a probe (0: none yet).
  double last_ordinary_mib_s_ ABSL_GUARDED_BY(mu_) = 0;
  // Dithering accumulators: whether to compress (x < 1), whether to go one
  // level up (x > 1).
  double compress_credit_ ABSL_GUARDED_BY(mu_) = 0;
  double level_credit_ ABSL_GUARDED_BY(mu_) = 0;
  Stats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_CODEC_GOVERNOR_H_
