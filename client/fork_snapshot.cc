#include "client/fork_snapshot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "io/errno_status.h"

namespace ckpt::client {
namespace {

constexpr uintptr_t kHugePage = 2 << 20;

// One mapping of /proc/self/smaps.
struct Vma {
  uintptr_t start = 0, end = 0;
  std::string header;  // the mapping's first line, for messages
  bool shared = false;
  uint64_t rss_kb = 0, anon_huge_kb = 0;
  std::vector<std::string> flags;
};

// "VmFlags" a fork cannot capture: the child would not see the memory
// ("dc": madvise MADV_DONTFORK, "wf": MADV_WIPEONFORK), later writes would
// show through ("sh": shared), or the memory is not ordinary pages (I/O and
// PFN mappings of devices, hugetlbfs, whose private copies can be taken back
// from a child).
const char* const kUnsafeFlags[] = {"dc", "wf", "sh", "io", "pf", "ht"};

uint64_t FieldKb(absl::string_view rest) {
  rest = absl::StripAsciiWhitespace(rest);
  absl::ConsumeSuffix(&rest, "kB");
  uint64_t v = 0;
  (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(rest), &v);
  return v;
}

std::vector<Vma> ParseVmas(absl::string_view smaps) {
  std::vector<Vma> vmas;
  for (absl::string_view line : absl::StrSplit(smaps, '\n')) {
    if (line.empty()) continue;
    // A mapping's first line: "start-end perms offset dev inode [path]".
    const size_t dash = line.find('-');
    const size_t space = line.find(' ');
    if (dash != absl::string_view::npos && space != absl::string_view::npos &&
        dash < space &&
        line.substr(0, dash).find_first_not_of("0123456789abcdef") ==
            absl::string_view::npos) {
      Vma v;
      v.start =
          std::strtoull(std::string(line.substr(0, dash)).c_str(), nullptr, 16);
      v.end = std::strtoull(
          std::string(line.substr(dash + 1, space - dash - 1)).c_str(), nullptr,
          16);
      const absl::string_view perms = line.substr(space + 1, 4);
      v.shared = perms.size() == 4 && perms[3] == 's';
      v.header = std::string(line);
      vmas.push_back(std::move(v));
      continue;
    }
    if (vmas.empty()) continue;
    Vma& v = vmas.back();
    if (absl::ConsumePrefix(&line, "Rss:")) {
      v.rss_kb = FieldKb(line);
    } else if (absl::ConsumePrefix(&line, "AnonHugePages:")) {
      v.anon_huge_kb = FieldKb(line);
    } else if (absl::ConsumePrefix(&line, "VmFlags:")) {
      v.flags = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    }
  }
  std::sort(vmas.begin(), vmas.end(),
            [](const Vma& a, const Vma& b) { return a.start < b.start; });
  return vmas;
}

}  // namespace

ForkInspection ParseSmaps(absl::string_view smaps,
                          const std::vector<HostRegion>& regions) {
  ForkInspection out;
  const std::vector<Vma> vmas = ParseVmas(smaps);
  double huge_weighted = 0, covered = 0;
  for (const HostRegion& r : regions) {
    if (r.size == 0) continue;
    const uintptr_t begin = reinterpret_cast<uintptr_t>(r.data);
    const uintptr_t end = begin + r.size;
    // The first mapping ending after `begin`.
    auto it = std::upper_bound(
        vmas.begin(), vmas.end(), begin,
        [](uintptr_t addr, const Vma& v) { return addr < v.end; });
    uintptr_t at = begin;
    for (; at < end && it != vmas.end() && it->start <= at; ++it) {
      const Vma& v = *it;
      const uintptr_t upto = std::min(end, v.end);
      if (out.unsafe.empty()) {
        if (v.shared) {
          out.unsafe = absl::StrCat("memory at 0x", absl::Hex(at),
                                    " is a shared mapping (", v.header, ")");
        }
        for (const char* flag : kUnsafeFlags) {
          if (out.unsafe.empty() && std::find(v.flags.begin(), v.flags.end(),
                                              flag) != v.flags.end()) {
            out.unsafe = absl::StrCat("memory at 0x", absl::Hex(at),
                                      " is in a mapping with VmFlags \"", flag,
                                      "\" (", v.header, ")");
          }
        }
      }
      const double overlap = static_cast<double>(upto - at);
      if (v.rss_kb > 0) {
        huge_weighted +=
            overlap * std::min(1.0, static_cast<double>(v.anon_huge_kb) /
                                        static_cast<double>(v.rss_kb));
      }
      covered += overlap;
      at = upto;
    }
    if (at < end && out.unsafe.empty()) {
      out.unsafe = absl::StrCat("memory at 0x", absl::Hex(at),
                                " is not mapped by this process");
    }
  }
  out.huge_page_share = covered > 0 ? huge_weighted / covered : 0;
  return out;
}

absl::StatusOr<ForkInspection> Inspect(const std::vector<HostRegion>& regions) {
  // A proc file has no size: read to the end.
  const int fd = ::open("/proc/self/smaps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return io::ErrnoToStatus(errno, "/proc/self/smaps");
  std::string smaps;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      smaps.append(buf, static_cast<size_t>(n));
    } else if (n == 0) {
      break;
    } else if (errno != EINTR) {
      const int err = errno;
      ::close(fd);
      return io::ErrnoToStatus(err, "reading /proc/self/smaps");
    }
  }
  ::close(fd);
  return ParseSmaps(smaps, regions);
}

void AdviseHugePages(void* data, size_t size) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  const uintptr_t first = (begin + kHugePage - 1) / kHugePage * kHugePage;
  const uintptr_t last = (begin + size) / kHugePage * kHugePage;
  if (last > first) {
    (void)::madvise(reinterpret_cast<void*>(first), last - first,
                    MADV_HUGEPAGE);
  }
}

int WriteRegions(int fd, const std::vector<HostRegion>& regions) {
  for (const HostRegion& r : regions) {
    const auto* p = static_cast<const char*>(r.data);
    for (size_t done = 0; done < r.size;) {
      const ssize_t n = ::pwrite(fd, p + done, r.size - done,
                                 static_cast<off_t>(r.file_offset + done));
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0) {
        return EIO;
      } else if (errno != EINTR) {
        return errno;
      }
    }
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<ForkedCopy>> ForkedCopy::Start(
    int fd, const std::vector<HostRegion>& regions) {
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) {
    return io::ErrnoToStatus(errno, "pipe for the snapshot child");
  }
  const pid_t parent = ::getpid();
  // _Fork, not fork: no atfork handlers (the trainer's libraries may have
  // some that take locks or start threads), and async-signal-safe.
  const pid_t pid = ::_Fork();
  if (pid < 0) {
    const int err = errno;
    ::close(report[0]);
    ::close(report[1]);
    return io::ErrnoToStatus(err, "fork for the snapshot copy");
  }
  if (pid == 0) {
    // The child: async-signal-safe calls only. It dies with the thread that
    // forked it, so a killed trainer leaves no writer behind in a slot the
    // daemon may hand out again.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    const int err = WriteRegions(fd, regions);
    ssize_t ignored = ::write(report[1], &err, sizeof(err));
    (void)ignored;
    ::_exit(0);
  }
  ::close(report[1]);
  return std::unique_ptr<ForkedCopy>(new ForkedCopy(pid, report[0]));
}

ForkedCopy::~ForkedCopy() {
  if (!reaped_) (void)Wait();
}

absl::Status ForkedCopy::Wait() {
  if (reaped_) {
    return absl::FailedPreconditionError("the snapshot child was waited for");
  }
  int err = -1;
  size_t got = 0;
  while (got < sizeof(err)) {
    const ssize_t n = ::read(report_fd_, reinterpret_cast<char*>(&err) + got,
                             sizeof(err) - got);
    if (n > 0) {
      got += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  ::close(report_fd_);
  report_fd_ = -1;
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(pid_, &status, 0);
  } while (reaped < 0 && errno == EINTR);
  reaped_ = true;
  if (got == sizeof(err)) {
    if (err == 0) return absl::OkStatus();
    return io::ErrnoToStatus(err, "the snapshot child writing the slot");
  }
  // No report: the child died. Its status is known unless someone else
  // reaped it (SIGCHLD ignored, or a waitpid(-1) elsewhere in the trainer).
  if (reaped == pid_ && WIFSIGNALED(status)) {
    return absl::AbortedError(absl::StrCat("the snapshot child (pid ", pid_,
                                           ") was killed by signal ",
                                           WTERMSIG(status)));
  }
  if (reaped == pid_ && WIFEXITED(status)) {
    return absl::AbortedError(
        absl::StrCat("the snapshot child (pid ", pid_, ") exited with status ",
                     WEXITSTATUS(status), " before writing the slot"));
  }
  return absl::AbortedError(absl::StrCat("the snapshot child (pid ", pid_,
                                         ") ended without a report"));
}

}  // namespace ckpt::client
