// ckpt-bench io: persist and restore throughput against fio on the same
// directory.

#include <cstring>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/chunk_codec.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/process.h"

namespace ckpt::bench {

namespace io = ckpt::io;
namespace snapshot = ckpt::snapshot;

using ckpt::tools::Median;
using ckpt::tools::Seconds;

namespace {

// Persists `data` as one tensor through the full pipeline; returns MiB/s and
// sets the ratio of stored to raw bytes.
// With `codec` CODEC_NONE every chunk is stored raw; `chunk_xxh3` (when not
// empty) are its chunks' hashes, taken beforehand as a client takes them while
// it copies into the staging slot.
double Persist(const std::string& path, absl::Span<const uint8_t> data,
               ckpt::proto::DType dtype, int threads, double* stored_ratio,
               ckpt::proto::Codec codec = ckpt::proto::CODEC_ZSTD,
               absl::Span<const uint64_t> chunk_xxh3 = {}) {
  const double mib = static_cast<double>(data.size()) / (1 << 20);
  const int64_t elements =
      static_cast<int64_t>(data.size() / snapshot::DTypeSize(dtype));
  snapshot::ShardWriterOptions options;
  options.encode_threads = threads;
  options.codec.codec = codec;
  auto start = std::chrono::steady_clock::now();
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                               {"bench", 1, 0, 1}, options);
  absl::Status s = writer.AddTensor(
      {"data", dtype, {elements}, {0}, {elements}, data, chunk_xxh3});
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
      fr_r, raw_r, hashed_r;
  // What a client hands ckptd with a slot it hashed while copying.
  std::vector<uint64_t> hashes;
  for (size_t off = 0; off < bytes; off += snapshot::kDefaultChunkSize) {
    hashes.push_back(snapshot::Checksum(random.subspan(
        off, std::min<size_t>(snapshot::kDefaultChunkSize, bytes - off))));
  }
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
    // Raw chunks: hashed by the writer, and hashed already (pure writes).
    (void)io::DefaultFileSystem()->Unlink(shard);
    raw_r.push_back(Persist(shard, random, ckpt::proto::DTYPE_UINT8, threads,
                            &unused, ckpt::proto::CODEC_NONE) /
                    fio_w.back());
    (void)io::DefaultFileSystem()->Unlink(shard);
    hashed_r.push_back(Persist(shard, random, ckpt::proto::DTYPE_UINT8, threads,
                               &unused, ckpt::proto::CODEC_NONE, hashes) /
                       fio_w.back());
    (void)io::DefaultFileSystem()->Unlink(shard);
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
  // Incompressible bytes stored raw, against fio: the writer hashing each
  // chunk, and the chunks' hashes given (a client took them of its slot).
  j["raw_persist_vs_fio"] = Median(raw_r);
  j["raw_hashed_at_copy_persist_vs_fio"] = Median(hashed_r);
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
    std::printf("%-22s %10s %10s %8.3f\n", "persist (raw)", "", "",
                Median(raw_r));
    std::printf("%-22s %10s %10s %8.3f\n", "persist (raw, hashed)", "", "",
                Median(hashed_r));
    std::printf("float32 stored/raw: %.3f\n", Median(ratio));
  }
  return 0;
}

}  // namespace ckpt::bench
