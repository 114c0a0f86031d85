// Fork snapshots: capture host memory regions at one instant without copying
// them on the caller's time. fork() gives a child process a copy-on-write view
// of the trainer's memory; the child writes the regions into the staging slot
// file while the trainer goes on, and the kernel copies a page first when the
// trainer writes to it. The trainer's stall is the fork (a page-table copy:
// about 1 ms per GiB of memory in 2 MiB pages, 40 ms per GiB in 4 KiB pages on
// the development VM), not a memcpy of the state.
//
// The cost moves, it does not vanish: a fork marks every private page of the
// process read-only, and the trainer's first write to each page after it
// faults (0.5 s per GiB of 4 KiB pages rewritten on the development VM, even
// after the child exited; little with huge pages once the child is done), and
// pages written while the child still runs are copied. Inspect() reports what
// makes a fork unsafe (shared, do-not-fork, wipe-on-fork or device mappings:
// the child would see later writes, or nothing) and the share of the regions
// in huge pages.
//
// The child runs only async-signal-safe calls (pwrite, write, prctl, _exit): it
// is forked from a multi-threaded process.
//
// Thread-safety: Inspect and ParseSmaps are thread-safe; a ForkedCopy is used
// by one thread, the one that started it (the child's parent-death signal
// follows that thread).
#ifndef CKPT_CLIENT_FORK_SNAPSHOT_H_
#define CKPT_CLIENT_FORK_SNAPSHOT_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::client {

// `size` bytes at `data`, to be written at `file_offset` of the slot file.
struct HostRegion {
  const void* data = nullptr;
  size_t size = 0;
  uint64_t file_offset = 0;
};

// What /proc/self/smaps says about the mappings under a set of regions.
struct ForkInspection {
  // Empty when a fork captures every region; else why not (naming the
  // mapping).
  std::string unsafe;
  // Bytes of the regions' mappings backed by transparent huge pages, as a
  // share of their resident bytes (0 when nothing is resident).
  double huge_page_share = 0;
};

// Inspects `regions` against `smaps` (the text of /proc/<pid>/smaps).
ForkInspection ParseSmaps(absl::string_view smaps,
                          const std::vector<HostRegion>& regions);
// The same against this process's /proc/self/smaps.
absl::StatusOr<ForkInspection> Inspect(const std::vector<HostRegion>& regions);

// Asks the kernel to back the 2 MiB-aligned interior of [data, data + size)
// with huge pages from now on (madvise MADV_HUGEPAGE; khugepaged collapses
// pages already there over time). Best effort.
void AdviseHugePages(void* data, size_t size);

// Writes every region to `fd` at its offset (pwrite); returns 0, or the errno
// of the write that failed. Async-signal-safe: the forked child runs it too.
int WriteRegions(int fd, const std::vector<HostRegion>& regions);

// A child process writing the regions, as they were at Start, into a file.
class ForkedCopy {
 public:
  // Forks. The child writes every region to `fd` (pwrite at its offset),
  // reports, and exits; it dies with the calling thread. An error (the fork
  // failed) leaves nothing running.
  static absl::StatusOr<std::unique_ptr<ForkedCopy>> Start(
      int fd, const std::vector<HostRegion>& regions);
  // Reaps the child if Wait was not called (waiting for it).
  ~ForkedCopy();

  // Waits for the child: OK once it wrote every byte, else what went wrong
  // (the failed write's errno, or the signal that killed it).
  absl::Status Wait();
  pid_t pid() const { return pid_; }

 private:
  ForkedCopy(pid_t pid, int report_fd) : pid_(pid), report_fd_(report_fd) {}
  pid_t pid_;
  int report_fd_;  // the read end of the child's report pipe; -1 once read
  bool reaped_ = false;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_FORK_SNAPSHOT_H_
