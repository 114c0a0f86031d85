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
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
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
#include "tools/metrics_text.h"
#include "tools/process.h"

namespace {

namespace io = ckpt::io;
namespace snapshot = ckpt::snapshot;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
      .count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

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

// Loopback TCP: one connection, `bytes` sent from a thread and received into a
// buffer; MiB/s. The reference for restores from peers.
double TcpCopyMibS(uint64_t bytes) {
  const int listener = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 1) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::cerr << "ckpt-bench: loopback TCP: " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  std::vector<char> out(4 << 20, 'x'), in(bytes);
  auto start = std::chrono::steady_clock::now();
  std::thread sender([&] {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0)
      std::exit(1);
    for (uint64_t sent = 0; sent < bytes;) {
      ssize_t n = ::send(fd, out.data(),
                         std::min<uint64_t>(out.size(), bytes - sent), 0);
      if (n <= 0) std::exit(1);
      sent += static_cast<uint64_t>(n);
    }
    ::close(fd);
  });
  const int conn = ::accept(listener, nullptr, nullptr);
  for (uint64_t got = 0; got < bytes;) {
    ssize_t n = ::recv(conn, in.data() + got, bytes - got, 0);
    if (n <= 0) std::exit(1);
    got += static_cast<uint64_t>(n);
  }
  sender.join();
  const double s = Seconds(start);
  ::close(conn);
  ::close(listener);
  return static_cast<double>(bytes) / (1 << 20) / s;
}

// `ckpt-bench recovery`: three ckptd on etcd with peer replication; a job of
// two ranks (nodes a and b) saves one step of `state_mib` and waits for its
// commit at tier peer; node a is then SIGKILLed and its directories deleted.
// Measured: detection (the kill until a trainer on b is told), rendezvous (the
// survivor and a replacement on node c rejoin the job's next epoch), restore
// (both ranks of the new epoch restore the step, the replacement from the
// replicas). The restore from peers is set against a plain TCP copy of the
// same bytes over loopback, measured in the same run.
int RunRecovery(const std::string& dir, uint64_t state_mib, bool json) {
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  std::filesystem::create_directories(dir);
  ckpt::tools::LocalEtcd local_etcd(dir + "/etcd");
  if (!local_etcd.Start()) {
    std::cerr << "ckpt-bench: etcd did not start; see " << local_etcd.log_path()
              << "\n";
    return 1;
  }
  const std::string etcd = local_etcd.endpoint();
  struct Node {
    std::string id, dir, staging;
    pid_t pid = -1;
    std::string socket() const { return dir + "/run/ckptd.sock"; }
  };
  std::vector<Node> nodes;
  for (const char* id : {"node-a", "node-b", "node-c"}) {
    Node n;
    n.id = id;
    n.dir = dir + "/" + id;
    n.staging =
        absl::StrCat("/dev/shm/ckpt-bench-recovery-", ::getpid(), "-", id);
    n.pid = ckpt::tools::Spawn({ckpt::tools::Sibling("../daemon/ckptd"),
                                "--socket",
                                n.socket(),
                                "--data-dir",
                                n.dir + "/data",
                                "--staging-dir",
                                n.staging,
                                "--memory-budget",
                                absl::StrCat(state_mib * 2 + 64, "M"),
                                "--replica-budget",
                                absl::StrCat(state_mib * 2 + 64, "M"),
                                "--coordinator",
                                "etcd://" + etcd,
                                "--lease-ttl",
                                "2",
                                "--node-id",
                                id,
                                "--peer-address",
                                "127.0.0.1:0",
                                "--peer-replicas",
                                "1"},
                               n.dir + ".log");
    nodes.push_back(n);
  }
  auto cleanup = [&] {
    for (Node& n : nodes) {
      if (n.pid > 0) {
        ::kill(n.pid, SIGKILL);
        ::waitpid(n.pid, nullptr, 0);
      }
      std::filesystem::remove_all(n.staging, ec);
      std::filesystem::remove_all(n.staging + ".peer", ec);
    }
    local_etcd.Kill();
  };
  auto fail = [&](const std::string& what, const absl::Status& s) {
    std::cerr << "ckpt-bench: " << what << ": " << s << " (logs in " << dir
              << ")\n";
    cleanup();
    return 1;
  };
  for (Node& n : nodes) {
    bool up = false;
    for (int i = 0; i < 400 && !up; ++i) {
      up =
          ckpt::client::Checkpointer::Connect({"probe", 0, 1, n.socket()}).ok();
      if (!up) std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    if (!up) return fail(n.id + " did not start", absl::UnavailableError(""));
  }
  // From the step's commit on disk to its commit at tier peer: both shard
  // files pushed (at once, each to a peer) and verified there.
  double disk_to_peer_commit_s = 0;
  // One rank's half of a float32 vector, incompressible: random bit
  // patterns, stored raw (float values of a narrow range compress by about
  // 15% with the byte shuffle, and their restore is then bound by zstd's
  // decoding on the cores there are, not by the transfer).
  const int64_t global = static_cast<int64_t>(state_mib << 20) / 4;
  const int64_t half = global / 2;
  std::mt19937 rng(7);
  std::vector<std::vector<float>> saved(2, std::vector<float>(half));
  for (auto& v : saved) {
    for (float& f : v) {
      const uint32_t bits = rng();
      std::memcpy(&f, &bits, sizeof f);
    }
  }
  auto connect = [&](const Node& n, uint32_t rank, std::vector<float>* w)
      -> absl::StatusOr<std::unique_ptr<ckpt::client::Checkpointer>> {
    auto c =
        ckpt::client::Checkpointer::Connect({"recovery", rank, 2, n.socket()});
    if (!c.ok()) return c.status();
    absl::Status r =
        (*c)->RegisterTensor("w", ckpt::proto::DTYPE_FLOAT32, w->data(),
                             {global}, {half * rank}, {half});
    if (!r.ok()) return r;
    return c;
  };
  {
    std::vector<std::shared_ptr<ckpt::client::SaveHandle>> saves;
    std::vector<std::unique_ptr<ckpt::client::Checkpointer>> ranks;
    for (uint32_t r = 0; r < 2; ++r) {
      auto c = connect(nodes[r], r, &saved[r]);
      if (!c.ok())
        return fail("connecting rank " + std::to_string(r), c.status());
      auto save = (*c)->SaveAsync(1);
      if (!save.ok()) return fail("saving", save.status());
      saves.push_back(*std::move(save));
      ranks.push_back(*std::move(c));
    }
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(ckpt::proto::TIER_LOCAL_DISK);
      if (!st.ok()) return fail("persisting step 1", st);
    }
    const auto replicating = std::chrono::steady_clock::now();
    for (auto& s : saves) {
      absl::Status st = s->WaitCommitted(ckpt::proto::TIER_PEER);
      if (!st.ok()) return fail("replicating step 1", st);
    }
    disk_to_peer_commit_s = Seconds(replicating);
  }
  // The survivor's trainer on node b watches for failures.
  std::vector<float> survivor_w(half), replacement_w(half);
  auto watcher = connect(nodes[1], 1, &survivor_w);
  if (!watcher.ok()) return fail("connecting the survivor", watcher.status());
  std::atomic<bool> told{false};
  absl::Status watching = (*watcher)->WatchFailures(
      [&](const std::vector<std::string>&) { told = true; });
  if (!watching.ok()) return fail("watching failures", watching);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const auto killed = std::chrono::steady_clock::now();
  ::kill(nodes[0].pid, SIGKILL);
  ::waitpid(nodes[0].pid, nullptr, 0);
  nodes[0].pid = -1;
  std::filesystem::remove_all(nodes[0].dir + "/data", ec);
  std::filesystem::remove_all(nodes[0].staging, ec);
  std::filesystem::remove_all(nodes[0].staging + ".peer", ec);
  while (!told && Seconds(killed) < 60) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  const double detect_s = Seconds(killed);
  if (!told) return fail("detecting the loss", absl::DeadlineExceededError(""));
  // The survivor and the replacement rejoin.
  auto rendezvous_start = std::chrono::steady_clock::now();
  std::vector<absl::StatusOr<ckpt::client::Epoch>> epochs(2);
  {
    std::vector<std::thread> joiners;
    for (int i = 0; i < 2; ++i) {
      joiners.emplace_back([&, i] {
        epochs[i] = ckpt::client::Rejoin(
            {.job = "recovery",
             .socket_path = nodes[i + 1].socket(),
             .participant = i == 0 ? "b-survivor" : "c-replacement",
             .min_ranks = 2,
             .max_ranks = 2,
             .timeout = absl::Seconds(60)});
      });
    }
    for (auto& t : joiners) t.join();
  }
  const double rendezvous_s = Seconds(rendezvous_start);
  for (auto& e : epochs) {
    if (!e.ok()) return fail("rejoining", e.status());
  }
  // The survivor keeps rank 1 on b; the replacement takes rank 0 on c.
  auto replacement = connect(nodes[2], 0, &replacement_w);
  if (!replacement.ok())
    return fail("connecting the replacement", replacement.status());
  // The replacement restores its rank from the peers, then the survivor its
  // own from local memory. In a real recovery they run at once on separate
  // machines; on one machine running them at once only shares its cores, so
  // they run one after the other and the restore time is their sum.
  auto restore_start = std::chrono::steady_clock::now();
  absl::Status restored_peer = (*replacement)->Restore(1);
  const double peer_restore_s = Seconds(restore_start);
  auto local_start = std::chrono::steady_clock::now();
  absl::Status restored_local = (*watcher)->Restore(1);
  const double local_restore_s = Seconds(local_start);
  const double restore_s = peer_restore_s + local_restore_s;
  if (!restored_peer.ok()) return fail("restoring from peers", restored_peer);
  if (!restored_local.ok()) return fail("restoring locally", restored_local);
  // Bit patterns (NaNs among them): compared as bytes.
  auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() &&
           std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
  };
  if (!same(replacement_w, saved[0]) || !same(survivor_w, saved[1])) {
    return fail("checking", absl::DataLossError("restored state differs"));
  }
  // Node c's daemon's side of the peer restore: the shard file's transfer
  // into its memory, checked (ckpt_peer_fetch*_total).
  double fetched_bytes = 0, fetch_s = 0;
  if (auto text = ckpt::client::GetMetricsText(nodes[2].socket()); text.ok()) {
    const auto samples = ckpt::tools::ParseMetricsText(*text);
    fetched_bytes = ckpt::tools::SumOf(samples, "ckpt_peer_fetched_bytes_total",
                                       {{"job", "recovery"}})
                        .value_or(0);
    fetch_s = ckpt::tools::SumOf(samples, "ckpt_peer_fetch_seconds_total",
                                 {{"job", "recovery"}})
                  .value_or(0);
  }
  const double shard_mib = static_cast<double>(half) * 4 / (1 << 20);
  const double peer_mib_s = shard_mib / peer_restore_s;
  const double fetch_mib_s =
      fetch_s > 0 ? fetched_bytes / (1 << 20) / fetch_s : 0;
  // The reference: loopback TCP copies of the same bytes, right after the
  // restore on the same loaded machine (the daemons still up); the median of
  // three, as one copy varies by 2x here.
  std::vector<double> tcp_runs;
  for (int i = 0; i < 3; ++i) {
    tcp_runs.push_back(TcpCopyMibS(static_cast<uint64_t>(half) * 4));
  }
  const double tcp_mib_s = Median(tcp_runs);
  cleanup();
  nlohmann::json j;
  j["benchmark"] = "recovery";
  j["state_mib"] = state_mib;
  j["lease_ttl_s"] = 2;
  j["detect_s"] = detect_s;
  j["rendezvous_s"] = rendezvous_s;
  j["restore_s"] = restore_s;
  j["recovery_s"] = detect_s + rendezvous_s + restore_s;
  j["disk_to_peer_commit_s"] = disk_to_peer_commit_s;
  j["restore_from_peer_s"] = peer_restore_s;
  j["restore_local_s"] = local_restore_s;
  j["restore_from_peer_mib_s"] = peer_mib_s;
  j["tcp_loopback_mib_s"] = tcp_mib_s;
  j["tcp_loopback_runs_mib_s"] = tcp_runs;
  j["restore_from_peer_vs_tcp"] = peer_mib_s / tcp_mib_s;
  j["fetch_from_peer_mib_s"] = fetch_mib_s;
  j["fetch_from_peer_vs_tcp"] = fetch_mib_s / tcp_mib_s;
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "recovery of a %llu MiB job after a node loss: %.2f s (detect %.2f s "
        "with a 2 s lease, rendezvous %.2f s, restore %.2f s)\n"
        "restore of the lost rank from peers: %.0f MiB/s (its shard file's "
        "fetch %.0f MiB/s); loopback TCP copy %.0f MiB/s; ratio %.2f (fetch "
        "%.2f)\n",
        static_cast<unsigned long long>(state_mib),
        detect_s + rendezvous_s + restore_s, detect_s, rendezvous_s, restore_s,
        peer_mib_s, fetch_mib_s, tcp_mib_s, peer_mib_s / tcp_mib_s,
        fetch_mib_s / tcp_mib_s);
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
