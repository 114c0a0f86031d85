// ckpt-bench save: SaveAsync stalls and throughput against memcpy (into a
// fresh tmpfs file, and into memory already faulted in), the same saves
// without chunk hashes, and a synchronous write.
#include <fcntl.h>
#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

namespace ckpt::bench {

namespace io = ckpt::io;

using ckpt::tools::Median;
using ckpt::tools::Seconds;

namespace {

// One memcpy of `data` into a fresh file on the same tmpfs as the staging
// slots.
double MemcpyToTmpfs(const std::string& staging,
                     absl::Span<const uint8_t> data) {
  std::string path = staging + "/ckpt-bench-memcpy";
  auto start = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ::ftruncate(fd, static_cast<off_t>(data.size())) != 0)
    std::exit(1);
  void* p =
      ::mmap(nullptr, data.size(), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  std::memcpy(p, data.data(), data.size());
  double s = Seconds(start);
  ::munmap(p, data.size());
  ::close(fd);
  ::unlink(path.c_str());
  return s;
}

// write + fsync of `data` to the data directory: what a synchronous save costs.
double SyncWrite(const std::string& dir, absl::Span<const uint8_t> data) {
  std::string path = dir + "/ckpt-bench-sync";
  auto start = std::chrono::steady_clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  size_t done = 0;
  while (fd >= 0 && done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done,
                        std::min<size_t>(data.size() - done, 64 << 20));
    if (n <= 0) std::exit(1);
    done += static_cast<size_t>(n);
  }
  ::fsync(fd);
  double s = Seconds(start);
  ::close(fd);
  ::unlink(path.c_str());
  return s;
}

// A trainer's state for `ckpt-bench save`: random bytes in anonymous memory,
// in transparent huge pages when asked (what fork snapshots want: see
// client/fork_snapshot.h).
class BenchState {
 public:
  BenchState(size_t bytes, bool huge_pages, std::mt19937_64& rng)
      : size_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
      std::cerr << "ckpt-bench: mmap of " << bytes << " bytes failed\n";
      std::exit(1);
    }
    if (huge_pages) (void)::madvise(p, bytes, MADV_HUGEPAGE);
    data_ = static_cast<uint8_t*>(p);
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      const uint64_t v = rng();
      std::memcpy(data_ + i, &v, 8);
    }
  }
  ~BenchState() { ::munmap(data_, size_); }
  BenchState(const BenchState&) = delete;
  BenchState& operator=(const BenchState&) = delete;

  uint8_t* data() { return data_; }
  size_t size() const { return size_; }
  absl::Span<const uint8_t> span() const { return {data_, size_}; }
  // What a training step does to the state, reduced to its page-level cost:
  // one write in every 4 KiB page. Returns the seconds it took.
  double Touch() {
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < size_; i += 4096) data_[i] ^= 1;
    return Seconds(start);
  }

 private:
  uint8_t* data_ = nullptr;
  size_t size_;
};

}  // namespace

int RunSave(const std::string& dir, std::vector<uint64_t> sizes_mib, int runs,
            int warmup, bool json, bool fork) {
  // A fresh catalog and data directory each run: steps of an earlier run would
  // be committed already.
  std::error_code ec;
  std::filesystem::remove_all(dir + "/data", ec);
  std::filesystem::create_directories(dir + "/run");
  BenchDaemon guard;
  guard.staging = "/dev/shm/ckpt-bench-staging-" + std::to_string(::getpid());
  const std::string& staging = guard.staging;
  std::filesystem::create_directories(staging);
  const uint64_t max_mib =
      *std::max_element(sizes_mib.begin(), sizes_mib.end());
  // Saving every step (the overlapped phase) persists each rank's newest
  // waiting save only; the other phases wait for each save's disk commit,
  // so none is skipped there.
  guard.pid = StartDaemon(dir, staging, 4 * max_mib + 64, {"--persist-newest"});
  if (guard.pid < 0) return 1;
  nlohmann::json j;
  j["benchmark"] = "save";
  j["dir"] = dir;
  j["runs"] = runs;
  j["host_snapshot"] = fork ? "fork" : "copy";
  j["persist_newest"] = true;
  // CKPT_HASH_STAGED=0 (read by libckpt): saves hand ckptd no chunk hashes.
  const char* hash_env = std::getenv("CKPT_HASH_STAGED");
  j["hash_staged_chunks"] = hash_env == nullptr || std::string(hash_env) != "0";
  ckpt::client::CheckpointerOptions options{"bench", 0, 1,
                                            dir + "/run/ckptd.sock"};
  options.host_snapshot = fork ? ckpt::client::HostSnapshot::kFork
                               : ckpt::client::HostSnapshot::kCopy;
  uint64_t step = 0;
  std::mt19937_64 rng(7);
  double sync_ratio = 0, touch_ratio = 0;
  // The same saves without chunk hashes: what hashing adds to the stall.
  ckpt::client::CheckpointerOptions plain_options = options;
  plain_options.hash_staged_chunks = false;
  for (uint64_t mib : sizes_mib) {
    BenchState state(mib << 20, fork, rng);
    auto connect = [&state](const ckpt::client::CheckpointerOptions& o)
        -> absl::StatusOr<std::unique_ptr<ckpt::client::Checkpointer>> {
      auto c = ckpt::client::Checkpointer::Connect(o);
      if (!c.ok()) return c.status();
      absl::Status s =
          (*c)->RegisterTensor("state", ckpt::proto::DTYPE_UINT8, state.data(),
                               {static_cast<int64_t>(state.size())}, {0},
                               {static_cast<int64_t>(state.size())});
      if (!s.ok()) return s;
      return c;
    };
    auto c = connect(options);
    if (!c.ok()) {
      std::cerr << "ckpt-bench: " << c.status() << "\n";
      return 1;
    }
    absl::StatusOr<std::unique_ptr<ckpt::client::Checkpointer>> plain;
    // The reference a copy can reach: memcpy into memory already faulted in
    // (a staging slot is made and pre-faulted ahead of the save).
    std::vector<uint8_t> prefaulted(state.size(), 1);
    std::vector<double> stall, memcpy_s, ratio, sync_s, touch, touch_after;
    std::vector<double> plain_stall, prefaulted_s;
    // A save of the state without hashes; its stall in seconds, or -1.
    auto plain_save = [&]() -> double {
      auto start = std::chrono::steady_clock::now();
      auto save = (*plain)->SaveAsync(++step);
      absl::Status st = save.ok() ? (*save)->WaitStaged() : save.status();
      const double stalled = Seconds(start);
      if (st.ok()) st = (*save)->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) {
        std::cerr << "ckpt-bench: save without hashes failed: " << st << "\n";
        return -1;
      }
      return stalled;
    };
    // Warm-up saves, timed apart: the first save of a size makes its slot
    // while the trainer waits, the next ones take slots ckptd made ahead but
    // the trainer has not mapped yet; from then on a slot and its mapping are
    // reused, which is what a job saving thousands of times sees.
    std::vector<double> warm;
    for (int w = 0; w < warmup; ++w) {
      auto start = std::chrono::steady_clock::now();
      auto save = (*c)->SaveAsync(++step);
      absl::Status st = save.ok() ? (*save)->WaitStaged() : save.status();
      warm.push_back(Seconds(start) * 1e3);
      if (st.ok()) st = (*save)->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) {
        std::cerr << "ckpt-bench: warm-up save of step " << step
                  << " failed: " << st << "\n";
        return 1;
      }
      if (!json) {
        std::fprintf(stderr, "%lu MiB warm-up save %d: stall %.1f ms\n",
                     static_cast<unsigned long>(mib), w + 1, warm.back());
      }
    }
    for (int r = 0; r < runs; ++r) {
      memcpy_s.push_back(MemcpyToTmpfs(staging, state.span()));
      {
        auto start = std::chrono::steady_clock::now();
        std::memcpy(prefaulted.data(), state.data(), state.size());
        prefaulted_s.push_back(Seconds(start));
      }
      touch.push_back(state.Touch());
      auto start = std::chrono::steady_clock::now();
      auto save = (*c)->SaveAsync(++step);
      absl::Status st = save.ok() ? (*save)->WaitStaged() : save.status();
      stall.push_back(Seconds(start));
      // The trainer goes on at once; with a fork snapshot, its first write to
      // each page faults.
      touch_after.push_back(state.Touch());
      if (st.ok()) st = (*save)->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) {
        std::cerr << "ckpt-bench: save of step " << step << " failed: " << st
                  << "\n";
        return 1;
      }
      ratio.push_back(stall.back() / memcpy_s.back());
      if (mib == sizes_mib.front()) {
        sync_s.push_back(SyncWrite(dir, state.span()));
        sync_ratio = Median(stall) / Median(sync_s);
        touch_ratio = (Median(stall) +
                       std::max(0.0, Median(touch_after) - Median(touch))) /
                      Median(sync_s);
      }
      if (!json) {
        std::fprintf(stderr,
                     "%lu MiB run %d: stall %.1f ms, memcpy %.1f ms (x%.2f), "
                     "pre-faulted %.1f ms; page-touch pass %.1f ms, right "
                     "after the save %.1f ms\n",
                     static_cast<unsigned long>(mib), r + 1, stall.back() * 1e3,
                     memcpy_s.back() * 1e3, ratio.back(),
                     prefaulted_s.back() * 1e3, touch.back() * 1e3,
                     touch_after.back() * 1e3);
      }
    }
    // Then the same saves of the same job without hashes (after their own
    // warm-up): its slots are the ones the saves above used.
    c = absl::UnavailableError("done");
    plain = connect(plain_options);
    if (!plain.ok()) {
      std::cerr << "ckpt-bench: " << plain.status() << "\n";
      return 1;
    }
    for (int r = -warmup; r < runs; ++r) {
      const double stalled = plain_save();
      if (stalled < 0) return 1;
      if (r >= 0) plain_stall.push_back(stalled);
    }
    // At the largest size, saving every step: each save waits only for its
    // copy, the trainer touches its state (a step), then saves again while
    // ckptd still persists the steps before.
    std::vector<double> overlapped;
    if (mib == sizes_mib.back()) {
      plain = absl::UnavailableError("done");
      c = connect(options);
      if (!c.ok()) {
        std::cerr << "ckpt-bench: " << c.status() << "\n";
        return 1;
      }
      std::vector<std::shared_ptr<ckpt::client::SaveHandle>> pending;
      for (int r = -warmup; r < 2 * runs; ++r) {
        auto start = std::chrono::steady_clock::now();
        auto save = (*c)->SaveAsync(++step);
        absl::Status st = save.ok() ? (*save)->WaitStaged() : save.status();
        if (r >= 0) overlapped.push_back(Seconds(start));
        if (!st.ok()) {
          std::cerr << "ckpt-bench: overlapped save failed: " << st << "\n";
          return 1;
        }
        pending.push_back(*save);
        state.Touch();
      }
      // The newest: the ones before it are committed or dropped by then.
      absl::Status st =
          pending.back()->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) {
        std::cerr << "ckpt-bench: overlapped save failed: " << st << "\n";
        return 1;
      }
    }
    std::string key = mib % 1024 == 0 ? std::to_string(mib / 1024) + "g"
                                      : std::to_string(mib) + "m";
    j["warmup_stall_ms_" + key] = warm;
    j["stall_ms_" + key] = Median(stall) * 1e3;
    j["memcpy_ms_" + key] = Median(memcpy_s) * 1e3;
    j["stall_vs_memcpy_" + key] = Median(ratio);
    j["prefaulted_memcpy_ms_" + key] = Median(prefaulted_s) * 1e3;
    j["stall_vs_prefaulted_memcpy_" + key] =
        Median(stall) / Median(prefaulted_s);
    if (!overlapped.empty()) {
      j["stall_overlapped_ms_" + key] = Median(overlapped) * 1e3;
      j["stall_overlapped_vs_prefaulted_memcpy_" + key] =
          Median(overlapped) / Median(prefaulted_s);
    }
    j["stall_unhashed_ms_" + key] = Median(plain_stall) * 1e3;
    j["hash_cost_in_stall_" + key] = Median(stall) / Median(plain_stall);
    if (mib == sizes_mib.back()) {
      j["hash_cost_in_stall"] = Median(stall) / Median(plain_stall);
    }
    j["touch_ms_" + key] = Median(touch) * 1e3;
    j["touch_after_save_ms_" + key] = Median(touch_after) * 1e3;
    if (!sync_s.empty()) j["sync_write_ms_" + key] = Median(sync_s) * 1e3;
  }
  j["stall_vs_sync_write"] = sync_ratio;
  // The stall plus what the trainer's first pass over its pages lost to the
  // save (page faults after a fork), against the synchronous write.
  j["stall_and_touch_vs_sync_write"] = touch_ratio;

  // Persist throughput while saves continue: after two warm-up saves (fresh
  // slots cost tmpfs page allocation, not persisting), back-to-back saves of
  // the first size, from the moment the first is staged (there is something
  // to persist) to the last commit on disk, against fio on the same disk.
  {
    const uint64_t mib = sizes_mib.front();
    BenchState state(mib << 20, fork, rng);
    auto c = ckpt::client::Checkpointer::Connect(options);
    if (!c.ok()) {
      std::cerr << "ckpt-bench: " << c.status() << "\n";
      return 1;
    }
    (void)(*c)->RegisterTensor("state", ckpt::proto::DTYPE_UINT8, state.data(),
                               {static_cast<int64_t>(state.size())}, {0},
                               {static_cast<int64_t>(state.size())});
    const int persist_warmup = 2, saves = 6;
    // fio writes the same bytes as the persist phase right before and right
    // after it; the reference is their mean. This VM's disk drifts by 2x
    // within minutes, so a reference taken at another time, or a burst
    // smaller than the phase, says more about the drift than about ckptd.
    const std::string fio_file = dir + "/ckpt-bench-fio.dat";
    auto fio_pass = [&] {
      double v =
          Fio(fio_file, true, saves * mib, io::PosixFsOptions{}.queue_depth);
      ::unlink(fio_file.c_str());
      return v;
    };
    const double fio_before = fio_pass();
    auto start = std::chrono::steady_clock::now();
    std::shared_ptr<ckpt::client::SaveHandle> last;
    for (int i = 0; i < persist_warmup + saves; ++i) {
      auto save_start = std::chrono::steady_clock::now();
      auto save = (*c)->SaveAsync(++step);
      const double begun = Seconds(save_start);
      absl::Status st = save.ok() ? (*save)->WaitStaged() : save.status();
      if (!json) {
        std::fprintf(stderr,
                     "persist phase: save %d: SaveAsync %.1f ms, staged "
                     "after %.1f ms\n",
                     i + 1, begun * 1e3, Seconds(save_start) * 1e3);
      }
      if (!st.ok()) {
        std::cerr << "ckpt-bench: save of step " << step << ": " << st << "\n";
        return 1;
      }
      if (i < persist_warmup)
        st = (*save)->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) {
        std::cerr << "ckpt-bench: " << st << "\n";
        return 1;
      }
      if (i == persist_warmup) start = std::chrono::steady_clock::now();
      last = *save;
      state.data()[i] ^= 1;  // training goes on
    }
    absl::Status committed = last->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
    if (!committed.ok()) {
      std::cerr << "ckpt-bench: " << committed << "\n";
      return 1;
    }
    double persist = saves * static_cast<double>(mib) / Seconds(start);
    const double fio_after = fio_pass();
    const double fio = (fio_before + fio_after) / 2;
    j["persist_mib_s"] = persist;
    j["fio_write_before_mib_s"] = fio_before;
    j["fio_write_after_mib_s"] = fio_after;
    j["fio_write_mib_s"] = fio;
    j["persist_vs_fio"] = persist / fio;
  }
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::cout << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace ckpt::bench
