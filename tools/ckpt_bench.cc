// ckpt-bench: throughput of ckpt's data paths against a reference measured in
// the same run.
//
//   ckpt-bench io [--dir DIR] [--size-mib N] [--runs R] [--json]
//
// `io` persists (ShardWriter: encode, io_uring O_DIRECT writes, fsync, rename)
// and restores (ShardReader: io_uring O_DIRECT reads, checksums, decode) N MiB
// of incompressible bytes and of float32 data, and runs fio (io_uring,
// O_DIRECT, 1 MiB blocks, sequential, same queue depth) on the same directory.
// Runs are interleaved; medians are reported.
//
//   ckpt-bench recovery [--dir DIR] [--state-mib N] [--json]
//
// `recovery` loses a node of a job on three local ckptd with peer replication
// and times detection, rendezvous and the restore from the replicas (against
// a loopback TCP copy of the same bytes).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "client/elastic.h"
#include "daemon/etcd_coordinator.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench_recovery.h"
#include "tools/metrics_text.h"
#include "tools/process.h"

namespace {

namespace io = ckpt::io;
namespace snapshot = ckpt::snapshot;

using ckpt::tools::Median;
using ckpt::tools::Seconds;

std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int rc = pclose(p);
  if (rc != 0) {
    std::cerr << "ckpt-bench: command failed (" << rc << "): " << cmd << "\n"
              << out << "\n";
    std::exit(1);
  }
  return out;
}

// fio's bandwidth in MiB/s for one sequential pass.
double Fio(const std::string& file, bool write, uint64_t size_mib,
           unsigned iodepth) {
  std::string cmd = absl::StrCat(
      "fio --name=ref --filename=", file,
      " --ioengine=io_uring --direct=1 --bs=1M --size=", size_mib,
      "M --rw=", write ? "write" : "read", " --iodepth=", iodepth,
      write ? " --end_fsync=1" : "", " --output-format=json 2>/dev/null");
  nlohmann::json j = nlohmann::json::parse(RunCapture(cmd));
  const auto& job = j["jobs"][0][write ? "write" : "read"];
  return job["bw_bytes"].get<double>() / (1 << 20);
}

// Persists `data` as one tensor through the full pipeline; returns MiB/s and
// sets the ratio of stored to raw bytes.
double Persist(const std::string& path, absl::Span<const uint8_t> data,
               ckpt::proto::DType dtype, int threads, double* stored_ratio) {
  const double mib = static_cast<double>(data.size()) / (1 << 20);
  const int64_t elements =
      static_cast<int64_t>(data.size() / snapshot::DTypeSize(dtype));
  snapshot::ShardWriterOptions options;
  options.encode_threads = threads;
  auto start = std::chrono::steady_clock::now();
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                               {"bench", 1, 0, 1}, options);
  absl::Status s =
      writer.AddTensor({"data", dtype, {elements}, {0}, {elements}, data});
  absl::StatusOr<ckpt::proto::ShardManifest> manifest =
      s.ok() ? writer.Commit() : absl::StatusOr<ckpt::proto::ShardManifest>(s);
  if (!manifest.ok()) {
    std::cerr << "ckpt-bench: persist failed: " << manifest.status() << "\n";
    std::exit(1);
  }
  double mib_s = mib / Seconds(start);
  uint64_t stored = 0;
  for (const auto& c : manifest->items(0).chunks()) stored += c.stored_size();
  *stored_ratio =
      static_cast<double>(stored) / static_cast<double>(data.size());
  return mib_s;
}

// Restores what Persist wrote, checks it is bit-exact, removes the file;
// returns MiB/s.
double Restore(const std::string& path, absl::Span<const uint8_t> expected,
               int threads) {
  std::vector<uint8_t> back(expected.size());
  snapshot::ShardReaderOptions options;
  options.decode_threads = threads;
  auto start = std::chrono::steady_clock::now();
  auto reader =
      snapshot::ShardReader::Open(io::DefaultFileSystem(), path, options);
  absl::Status s = reader.ok()
                       ? (*reader)->ReadItem("data", absl::MakeSpan(back))
                       : reader.status();
  double mib_s =
      static_cast<double>(expected.size()) / (1 << 20) / Seconds(start);
  if (!s.ok() ||
      std::memcmp(back.data(), expected.data(), expected.size()) != 0) {
    std::cerr << "ckpt-bench: restore failed or differs: " << s << "\n";
    std::exit(1);
  }
  (void)io::DefaultFileSystem()->Unlink(path);
  return mib_s;
}

}  // namespace

int RunIo(const std::string& dir, uint64_t size_mib, int runs, int threads,
          bool json) {
  absl::Status s = io::DefaultFileSystem()->CreateDirs(dir);
  if (!s.ok()) {
    std::cerr << "ckpt-bench: " << s.message() << "\n";
    return 1;
  }
  const size_t bytes = size_mib << 20;
  std::mt19937_64 rng(42);
  // Page aligned, as ckptd's staging slots are: uncompressed chunks are then
  // written from where they lie.
  io::AlignedBuffer random_buffer(bytes), floats_buffer(bytes);
  absl::Span<const uint8_t> random = random_buffer.span();
  absl::Span<const uint8_t> floats = floats_buffer.span();
  for (size_t i = 0; i + 8 <= bytes; i += 8) {
    uint64_t v = rng();
    std::memcpy(random_buffer.data() + i, &v, 8);
  }
  // Weights-like float32: normal(0, 0.02), the typical spread of initialized
  // layers.
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    float f = normal(rng);
    std::memcpy(floats_buffer.data() + i, &f, 4);
  }

  const unsigned iodepth = io::PosixFsOptions{}.queue_depth;
  std::string fio_file = io::JoinPath(dir, "ckpt-bench-fio.dat");
  std::string shard = io::JoinPath(dir, "ckpt-bench.shard");
  // Each measurement sits next to its reference in time, so drift of a shared
  // disk hits both; the ratios are medians of per-run ratios.
  std::vector<double> fio_w, fio_r, pw, pr, fw, fr, ratio, pw_r, pr_r, fw_r,
      fr_r;
  for (int r = 0; r < runs; ++r) {
    double unused;
    fio_w.push_back(Fio(fio_file, true, size_mib, iodepth));
    pw.push_back(
        Persist(shard, random, ckpt::proto::DTYPE_UINT8, threads, &unused));
    fio_r.push_back(Fio(fio_file, false, size_mib, iodepth));
    pr.push_back(Restore(shard, random, threads));
    (void)io::DefaultFileSystem()->Unlink(fio_file);
    double float_ratio = 0;
    fw.push_back(Persist(shard, floats, ckpt::proto::DTYPE_FLOAT32, threads,
                         &float_ratio));
    fr.push_back(Restore(shard, floats, threads));
    ratio.push_back(float_ratio);
    pw_r.push_back(pw.back() / fio_w.back());
    pr_r.push_back(pr.back() / fio_r.back());
    fw_r.push_back(fw.back() / fio_w.back());
    fr_r.push_back(fr.back() / fio_r.back());
    if (!json) {
      std::fprintf(stderr,
                   "run %d: fio write %.0f read %.0f | persist %.0f restore "
                   "%.0f | float32 "
                   "persist %.0f restore %.0f (stored/raw %.3f), MiB/s\n",
                   r + 1, fio_w.back(), fio_r.back(), pw.back(), pr.back(),
                   fw.back(), fr.back(), ratio.back());
    }
  }
  nlohmann::json j;
  j["benchmark"] = "io";
  j["dir"] = dir;
  j["size_mib"] = size_mib;
  j["runs"] = runs;
  j["threads"] = threads;
  j["io_uring"] = io::IoUringAvailable();
  j["queue_depth"] = iodepth;
  j["fio_write_mib_s"] = Median(fio_w);
  j["fio_read_mib_s"] = Median(fio_r);
  j["persist_mib_s"] = Median(pw);
  j["restore_mib_s"] = Median(pr);
  j["persist_vs_fio"] = Median(pw_r);
  j["restore_vs_fio"] = Median(pr_r);
  j["float_persist_mib_s"] = Median(fw);
  j["float_restore_mib_s"] = Median(fr);
  j["float_persist_vs_fio"] = Median(fw_r);
  j["float_restore_vs_fio"] = Median(fr_r);
  j["float_stored_ratio"] = Median(ratio);
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf("%-22s %10s %10s %s\n", "", "MiB/s", "fio MiB/s",
                "ratio (median of runs)");
    std::printf("%-22s %10.0f %10.0f %8.3f\n", "persist (random)", Median(pw),
                Median(fio_w), Median(pw_r));
    std::printf("%-22s %10.0f %10.0f %8.3f\n", "restore (random)", Median(pr),
                Median(fio_r), Median(pr_r));
    std::printf("%-22s %10.0f %10.0f %8.3f\n", "persist (float32)", Median(fw),
                Median(fio_w), Median(fw_r));
    std::printf("%-22s %10.0f %10.0f %8.3f\n", "restore (float32)", Median(fr),
                Median(fio_r), Median(fr_r));
    std::printf("float32 stored/raw: %.3f\n", Median(ratio));
  }
  return 0;
}

// Starts a ckptd for the benchmark; returns its pid.
pid_t StartDaemon(const std::string& dir, const std::string& staging,
                  uint64_t budget_mib) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  std::string ckptd =
      (self.parent_path() / "../daemon/ckptd").lexically_normal().string();
  std::string socket = dir + "/run/ckptd.sock";
  pid_t pid = ::fork();
  if (pid == 0) {
    FILE* f = std::fopen((dir + "/ckptd.log").c_str(), "a");
    if (f != nullptr) {
      ::dup2(fileno(f), 1);
      ::dup2(fileno(f), 2);
    }
    std::string budget = std::to_string(budget_mib) + "M";
    ::execl(ckptd.c_str(), ckptd.c_str(), "--socket", socket.c_str(),
            "--data-dir", (dir + "/data").c_str(), "--staging-dir",
            staging.c_str(), "--memory-budget", budget.c_str(), "--keep-memory",
            "1", "--keep-disk", "1", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  for (int i = 0; i < 200; ++i) {
    if (ckpt::client::Checkpointer::Connect({"bench", 0, 1, socket}).ok())
      return pid;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::cerr << "ckpt-bench: ckptd did not start; see " << dir << "/ckptd.log\n";
  ::kill(pid, SIGKILL);
  std::exit(1);
}

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

// The bench's ckptd: stopped, and its staging directory removed, however the
// bench ends.
struct BenchDaemon {
  pid_t pid = -1;
  std::string staging;
  ~BenchDaemon() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(staging, ec);
  }
};

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
  guard.pid = StartDaemon(dir, staging, 3 * max_mib + 64);
  if (guard.pid < 0) return 1;
  nlohmann::json j;
  j["benchmark"] = "save";
  j["dir"] = dir;
  j["runs"] = runs;
  j["host_snapshot"] = fork ? "fork" : "copy";
  ckpt::client::CheckpointerOptions options{"bench", 0, 1,
                                            dir + "/run/ckptd.sock"};
  options.host_snapshot = fork ? ckpt::client::HostSnapshot::kFork
                               : ckpt::client::HostSnapshot::kCopy;
  uint64_t step = 0;
  std::mt19937_64 rng(7);
  double sync_ratio = 0, touch_ratio = 0;
  for (uint64_t mib : sizes_mib) {
    BenchState state(mib << 20, fork, rng);
    auto c = ckpt::client::Checkpointer::Connect(options);
    if (!c.ok() ||
        !(*c)->RegisterTensor("state", ckpt::proto::DTYPE_UINT8, state.data(),
                              {static_cast<int64_t>(state.size())}, {0},
                              {static_cast<int64_t>(state.size())})
             .ok()) {
      std::cerr << "ckpt-bench: " << c.status() << "\n";
      return 1;
    }
    std::vector<double> stall, memcpy_s, ratio, sync_s, touch, touch_after;
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
                     "%lu MiB run %d: stall %.1f ms, memcpy %.1f ms (x%.2f); "
                     "page-touch pass %.1f ms, right after the save %.1f ms\n",
                     static_cast<unsigned long>(mib), r + 1, stall.back() * 1e3,
                     memcpy_s.back() * 1e3, ratio.back(), touch.back() * 1e3,
                     touch_after.back() * 1e3);
      }
    }
    std::string key = mib % 1024 == 0 ? std::to_string(mib / 1024) + "g"
                                      : std::to_string(mib) + "m";
    j["warmup_stall_ms_" + key] = warm;
    j["stall_ms_" + key] = Median(stall) * 1e3;
    j["memcpy_ms_" + key] = Median(memcpy_s) * 1e3;
    j["stall_vs_memcpy_" + key] = Median(ratio);
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

// `ckpt-bench torch`: bench_torch.py (next to the ckpt Python package in the
// build tree) against the benchmark's own ckptd.
int RunTorch(const std::string& dir, uint64_t state_mib, int runs, bool json,
             const std::string& host_snapshot, bool huge_pages,
             std::string python) {
  std::error_code ec;
  std::filesystem::remove_all(dir + "/data", ec);
  std::filesystem::create_directories(dir + "/run");
  BenchDaemon guard;
  guard.staging = "/dev/shm/ckpt-bench-staging-" + std::to_string(::getpid());
  std::filesystem::create_directories(guard.staging);
  guard.pid = StartDaemon(dir, guard.staging, 3 * state_mib + 256);
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string python_dir =
      (self.parent_path() / "../python").lexically_normal().string();
  const std::string script = python_dir + "/bench_torch.py";
  // PyPI's PyTorch (tools/torch-venv.sh) when the build has it: DCP's
  // async_save is the reference there. Else Debian's python3-torch.
  if (python.empty()) {
    const std::string venv =
        (self.parent_path() / "../torch-venv/bin/python").lexically_normal();
    python = ::access(venv.c_str(), X_OK) == 0 ? venv : CKPT_PYTHON;
  }
  const std::string socket = dir + "/run/ckptd.sock";
  const std::string mib = std::to_string(state_mib);
  const std::string runs_arg = std::to_string(runs);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::setenv("PYTHONPATH", python_dir.c_str(), 1);
    // glibc's malloc then asks for transparent huge pages for its large
    // allocations (torch's tensors), what fork snapshots want.
    if (huge_pages) ::setenv("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1", 1);
    std::vector<const char*> argv = {
        python.c_str(),   script.c_str(),    "--socket",
        socket.c_str(),   "--dir",           dir.c_str(),
        "--state-mib",    mib.c_str(),       "--runs",
        runs_arg.c_str(), "--host-snapshot", host_snapshot.c_str()};
    if (huge_pages) argv.push_back("--huge-pages");
    if (json) argv.push_back("--json");
    argv.push_back(nullptr);
    ::execv(python.c_str(), const_cast<char* const*>(argv.data()));
    std::cerr << "ckpt-bench: cannot run " << python << ": "
              << std::strerror(errno) << "\n";
    ::_exit(127);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// `ckpt-bench control-plane`: `ranks` ranks of one job, spread over `nodes`
// etcd coordinators (one per simulated ckptd, voting for their ranks in
// parallel), vote for one step; the time from the first vote to the commit.
// Against its own etcd on loopback unless `etcd` names one.
int RunControlPlane(const std::string& dir, std::string etcd, int ranks,
                    int nodes, int runs, bool json) {
  ckpt::tools::LocalEtcd local(dir + "/etcd");
  if (etcd.empty()) {
    if (!local.Start()) {
      std::cerr << "ckpt-bench: etcd did not start; see " << local.log_path()
                << "\n";
      return 1;
    }
    etcd = local.endpoint();
  }
  auto stop_etcd = [&] { local.Kill(); };
  std::vector<std::unique_ptr<ckpt::daemon::EtcdCoordinator>> coordinators;
  for (int n = 0; n < nodes; ++n) {
    absl::StatusOr<std::unique_ptr<ckpt::daemon::EtcdCoordinator>> c;
    for (int i = 0; i < 200; ++i) {
      c = ckpt::daemon::EtcdCoordinator::Connect(
          {.endpoints = {etcd}, .node_id = absl::StrCat("bench-node-", n)});
      if (c.ok()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (!c.ok()) {
      std::cerr << "ckpt-bench: etcd at " << etcd << ": " << c.status() << "\n";
      stop_etcd();
      return 1;
    }
    coordinators.push_back(*std::move(c));
  }
  const std::string job = absl::StrCat("bench-", ::getpid());
  std::vector<double> seconds;
  for (int run = 0; run < runs; ++run) {
    const uint64_t step = run + 1;
    std::atomic<bool> failed{false};
    auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> voters;
    for (int n = 0; n < nodes; ++n) {
      voters.emplace_back([&, n] {
        for (int r = n; r < ranks; r += nodes) {
          auto done = coordinators[n]->Vote(job, step, r, ranks,
                                            {ckpt::proto::TIER_MEMORY});
          if (!done.ok()) {
            std::cerr << "ckpt-bench: " << done.status() << "\n";
            failed = true;
            return;
          }
        }
      });
    }
    for (auto& t : voters) t.join();
    seconds.push_back(Seconds(start));
    auto commit =
        coordinators[0]->GetCommit(job, step, ckpt::proto::TIER_MEMORY);
    if (failed || !commit.ok() || !commit->has_value()) {
      std::cerr << "ckpt-bench: step " << step << " was not committed\n";
      stop_etcd();
      return 1;
    }
  }
  coordinators.clear();
  stop_etcd();
  std::sort(seconds.begin(), seconds.end());
  const double median = seconds[seconds.size() / 2];
  nlohmann::json j;
  j["benchmark"] = "control-plane";
  j["ranks"] = ranks;
  j["nodes"] = nodes;
  j["runs"] = runs;
  j[absl::StrCat("commit_", ranks, "_ranks_s")] = median;
  j["commit_s_min"] = seconds.front();
  j["commit_s_max"] = seconds.back();
  j["votes_per_s"] = ranks / median;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%d ranks on %d nodes commit one step through etcd in %.3f s "
        "(median of %d; %.0f votes/s)\n",
        ranks, nodes, median, runs, ranks / median);
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{"ckpt-bench: ckpt's data paths against same-run references"};
  app.require_subcommand(1);
  std::string dir = ".";
  uint64_t size_mib = 1024;
  int runs = 3;
  int threads = 2;
  bool json = false;
  CLI::App* io_cmd =
      app.add_subcommand("io", "persist and restore throughput vs fio");
  io_cmd->add_option("--dir", dir, "directory on the disk to measure");
  io_cmd->add_option("--size-mib", size_mib, "bytes per pass, in MiB")
      ->check(CLI::Range(16, 1 << 20));
  io_cmd->add_option("--runs", runs, "passes; medians are reported")
      ->check(CLI::Range(1, 100));
  io_cmd->add_option("--threads", threads, "encode/decode threads")
      ->check(CLI::Range(1, 256));
  io_cmd->add_flag("--json", json, "print one JSON object");
  std::vector<uint64_t> sizes_mib = {1024, 4096};
  CLI::App* save_cmd =
      app.add_subcommand("save",
                         "stall of SaveAsync+WaitStaged vs memcpy and a "
                         "synchronous save; persist vs fio");
  save_cmd->add_option("--dir", dir,
                       "data directory of the benchmark's ckptd (on the disk)");
  save_cmd->add_option("--sizes-mib", sizes_mib, "state sizes in MiB")
      ->delimiter(',');
  save_cmd->add_option("--runs", runs, "saves per size; medians are reported")
      ->check(CLI::Range(1, 100));
  int warmup = 2;
  save_cmd
      ->add_option("--warmup", warmup,
                   "saves per size before the timed ones (reported apart as "
                   "warmup_stall_ms_*)")
      ->check(CLI::Range(0, 100));
  save_cmd->add_flag("--json", json, "print one JSON object");
  std::string save_snapshot = "copy";
  save_cmd
      ->add_option("--host-snapshot", save_snapshot,
                   "how the state is captured: copy, or fork (the state then "
                   "in huge pages)")
      ->check(CLI::IsMember({"copy", "fork"}));
  uint64_t state_mib = 768;
  CLI::App* torch_cmd = app.add_subcommand(
      "torch",
      "stall of ckpt.torch save_async+wait_staged vs torch.save, and vs "
      "DCP's async_save with PyTorch 2.x (needs python3-torch or "
      "build/torch-venv)");
  torch_cmd->add_option("--dir", dir,
                        "data directory of the benchmark's ckptd and of "
                        "torch.save's file (on the disk)");
  torch_cmd
      ->add_option("--state-mib", state_mib,
                   "model parameters plus Adam state, in MiB")
      ->check(CLI::Range(16, 1 << 20));
  torch_cmd->add_option("--runs", runs, "saves; medians are reported")
      ->check(CLI::Range(1, 100));
  torch_cmd->add_flag("--json", json, "print one JSON object");
  std::string host_snapshot = "copy";
  torch_cmd
      ->add_option("--host-snapshot", host_snapshot,
                   "how ckpt.torch captures the CPU tensors")
      ->check(CLI::IsMember({"copy", "fork"}));
  bool huge_pages = true;
  torch_cmd->add_flag("--huge-pages,!--no-huge-pages", huge_pages,
                      "run the trainer with "
                      "GLIBC_TUNABLES=glibc.malloc.hugetlb=1 (default on)");
  std::string torch_python;
  torch_cmd->add_option("--python", torch_python,
                        "the interpreter (default: build/torch-venv's when "
                        "there, else Debian's python3)");
  int cp_ranks = 1024, cp_nodes = 128;
  std::string etcd;
  CLI::App* cp_cmd = app.add_subcommand(
      "control-plane",
      "time for N ranks voting through etcd to commit one step");
  cp_cmd->add_option("--dir", dir, "where the benchmark's etcd keeps its data");
  cp_cmd->add_option("--etcd", etcd, "an etcd to use (host:port) instead");
  cp_cmd->add_option("--ranks", cp_ranks)->check(CLI::Range(1, 1 << 20));
  cp_cmd->add_option("--nodes", cp_nodes, "simulated ckptd, voting in parallel")
      ->check(CLI::Range(1, 4096));
  cp_cmd->add_option("--runs", runs, "steps; the median is reported")
      ->check(CLI::Range(1, 100));
  cp_cmd->add_flag("--json", json, "print one JSON object");
  uint64_t recovery_mib = 256;
  CLI::App* rec_cmd = app.add_subcommand(
      "recovery",
      "a node lost: detection, rendezvous and restore from peer replicas "
      "(three ckptd on a local etcd)");
  rec_cmd->add_option("--dir", dir, "where the nodes keep their data");
  rec_cmd->add_option("--state-mib", recovery_mib, "the job's state, in MiB")
      ->check(CLI::Range(2, 1 << 16));
  rec_cmd->add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*save_cmd) {
    return RunSave(dir, sizes_mib, runs, warmup, json, save_snapshot == "fork");
  }
  if (*torch_cmd) {
    return RunTorch(dir, state_mib, runs, json, host_snapshot, huge_pages,
                    torch_python);
  }
  if (*rec_cmd)
    return RunRecovery(dir + "/ckpt-bench-recovery", recovery_mib, json);
  if (*cp_cmd) {
    return RunControlPlane(dir + "/ckpt-bench-etcd", etcd, cp_ranks, cp_nodes,
                           runs, json);
  }
  return RunIo(dir, size_mib, runs, threads, json);
}
