// ckpt-bench codec: what ckpt stores for real training state (made by
// tools/gen_training_state.py) against byte-shuffle + zstd -1 on the same
// data, what incremental saves write, and persist and restore throughput
// against fio in the same run.

#include <zstd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/aligned_buffer.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/chunk_codec.h"
#include "snapshot/dtype.h"
#include "snapshot/filter.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tools/bench_stats.h"
#include "tools/bench_training_state.h"
#include "tools/ckpt_bench.h"

namespace ckpt::bench {

namespace io = ckpt::io;
namespace snapshot = ckpt::snapshot;
namespace proto = ckpt::proto;

using ckpt::tools::Seconds;

namespace {

// Chunks of `chunk` bytes of every tensor, as the writer cuts them.
template <typename F>
void ForEachChunk(const Snapshot& s, uint32_t chunk, F f) {
  for (const Tensor& t : s.tensors) {
    for (size_t off = 0; off < t.data.size(); off += chunk) {
      f(t, t.data.subspan(off, std::min<size_t>(chunk, t.data.size() - off)));
    }
  }
}

struct CodecResult {
  uint64_t stored = 0;
  double seconds = 0;
  double decode_seconds = 0;  // ckpt's codec only
};

// The reference: byte-shuffle then zstd -1, per 4 MiB chunk, on this thread.
CodecResult ZstdShuffle(const Snapshot& s) {
  CodecResult r;
  std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)> cctx(ZSTD_createCCtx(),
                                                          ZSTD_freeCCtx);
  std::vector<uint8_t> shuffled(snapshot::kDefaultChunkSize);
  std::vector<uint8_t> out(ZSTD_compressBound(snapshot::kDefaultChunkSize));
  auto start = std::chrono::steady_clock::now();
  ForEachChunk(s, snapshot::kDefaultChunkSize,
               [&](const Tensor& t, absl::Span<const uint8_t> raw) {
                 snapshot::ByteShuffle(raw.data(), shuffled.data(), raw.size(),
                                       snapshot::DTypeSize(t.dtype));
                 size_t n =
                     ZSTD_compressCCtx(cctx.get(), out.data(), out.size(),
                                       shuffled.data(), raw.size(), 1);
                 if (ZSTD_isError(n)) Die(ZSTD_getErrorName(n));
                 r.stored += n;
               });
  r.seconds = Seconds(start);
  return r;
}

// ckpt's chunk codec with its default options, on this thread, given each
// chunk's raw hash as ckptd is: every chunk encoded (timed), then every chunk
// encoded again and decoded back, checksums included, as a restore does (the
// decode timed). Encodes are timed in a pass
// of their own, as the reference's are: a decode between two encodes would
// evict the compressor's tables from the cache.
CodecResult Ckpt(const Snapshot& s) {
  CodecResult r;
  const snapshot::CodecOptions options;
  io::BufferPool pool(snapshot::MaxEncodedSize(snapshot::kDefaultChunkSize), 2);
  std::vector<uint8_t> back(snapshot::kDefaultChunkSize);
  // The chunks' raw hashes come with them, as ckptd gets them: the trainer's
  // copy threads (or its GPU) take them while staging the slot.
  std::vector<uint64_t> hashes;
  ForEachChunk(s, snapshot::kDefaultChunkSize,
               [&](const Tensor&, absl::Span<const uint8_t> raw) {
                 hashes.push_back(snapshot::Checksum(raw));
               });
  size_t next = 0;
  auto encode = [&](const Tensor& t, absl::Span<const uint8_t> raw,
                    snapshot::ChunkHeader* header) {
    absl::StatusOr<snapshot::EncodedChunk> e = snapshot::EncodeChunk(
        raw, static_cast<uint32_t>(snapshot::DTypeSize(t.dtype)), options,
        &pool, header, hashes[next++ % hashes.size()]);
    if (!e.ok()) Die(std::string(e.status().message()));
    return *std::move(e);
  };
  auto start = std::chrono::steady_clock::now();
  ForEachChunk(s, snapshot::kDefaultChunkSize,
               [&](const Tensor& t, absl::Span<const uint8_t> raw) {
                 snapshot::ChunkHeader header;
                 (void)encode(t, raw, &header);
                 r.stored += header.stored_size;
               });
  r.seconds = Seconds(start);
  ForEachChunk(s, snapshot::kDefaultChunkSize,
               [&](const Tensor& t, absl::Span<const uint8_t> raw) {
                 snapshot::ChunkHeader header;
                 snapshot::EncodedChunk e = encode(t, raw, &header);
                 const uint8_t* stored = e.head.data() + header.stored_offset;
                 if (!e.body.empty()) stored = e.body.data();
                 const auto decode_start = std::chrono::steady_clock::now();
                 absl::Status d = snapshot::DecodeChunk(
                     header, {stored, header.stored_size},
                     absl::MakeSpan(back.data(), raw.size()));
                 r.decode_seconds += Seconds(decode_start);
                 if (!d.ok()) Die(std::string(d.message()));
               });
  return r;
}

// What storing changed chunks as the XOR with the same chunk of an earlier
// save would gain (#22 part 2, measured, not built): for each save after the
// first, the stored size of every changed chunk encoded as it is, over the
// smaller of that and its XOR with the previous save's chunk
// (`from_previous`, a delta chain as long as the save chain) or with the
// chain's first save (a chain of one delta). One core, ckpt's codec.
double XorDeltaGain(const std::vector<Snapshot>& run, bool from_previous) {
  const snapshot::CodecOptions options;
  io::BufferPool pool(snapshot::MaxEncodedSize(snapshot::kDefaultChunkSize), 2);
  std::vector<uint8_t> delta(snapshot::kDefaultChunkSize);
  auto stored = [&](absl::Span<const uint8_t> raw, uint32_t width) {
    snapshot::ChunkHeader header;
    absl::StatusOr<snapshot::EncodedChunk> e =
        snapshot::EncodeChunk(raw, width, options, &pool, &header);
    if (!e.ok()) Die(std::string(e.status().message()));
    return static_cast<double>(header.stored_size);
  };
  double as_is = 0, as_delta = 0;
  for (size_t i = 1; i < run.size(); ++i) {
    const Snapshot& base = run[from_previous ? i - 1 : 0];
    for (size_t t = 0; t < run[i].tensors.size(); ++t) {
      const Tensor& now = run[i].tensors[t];
      const Tensor& then = base.tensors[t];
      const Tensor& before = run[i - 1].tensors[t];
      const auto width = static_cast<uint32_t>(snapshot::DTypeSize(now.dtype));
      for (size_t off = 0; off < now.data.size();
           off += snapshot::kDefaultChunkSize) {
        const size_t n = std::min<size_t>(snapshot::kDefaultChunkSize,
                                          now.data.size() - off);
        const auto chunk = now.data.subspan(off, n);
        if (std::memcmp(chunk.data(), before.data.data() + off, n) == 0)
          continue;  // unchanged: not written at all
        for (size_t k = 0; k < n; ++k) delta[k] = chunk[k] ^ then.data[off + k];
        const double whole = stored(chunk, width);
        as_is += whole;
        as_delta += std::min(whole, stored({delta.data(), n}, width));
      }
    }
  }
  return as_delta > 0 ? as_is / as_delta : 1.0;
}

struct Written {
  uint64_t file_bytes = 0;
  double seconds = 0;
  std::shared_ptr<snapshot::ShardBase> as_base;
  snapshot::ShardWriteStats chunks;
};

// `s` copied as many times as it takes to reach `min_bytes` (a rank's share
// of a larger model: the same kind of bytes), each copy's tensors renamed.
Snapshot Tiled(const Snapshot& s, uint64_t min_bytes) {
  const uint64_t raw = std::max<uint64_t>(s.raw(), 1);
  const uint64_t copies = std::max<uint64_t>(1, (min_bytes + raw - 1) / raw);
  Snapshot out;
  out.step = s.step;
  out.bytes = io::AlignedBuffer(io::AlignUp(copies * raw));
  uint64_t at = 0;
  for (uint64_t c = 0; c < copies; ++c) {
    for (const Tensor& t : s.tensors) {
      std::memcpy(out.bytes.data() + at, t.data.data(), t.data.size());
      out.tensors.push_back({absl::StrCat("copy", c, "/", t.name), t.dtype,
                             t.shape,
                             out.bytes.span().subspan(at, t.data.size())});
      at += t.data.size();
    }
  }
  return out;
}

// Persists a snapshot as step `step` of rank 0 (over `base` when given),
// through the writer's full pipeline: io_uring, O_DIRECT, fsync.
Written Persist(const std::string& dir, uint64_t step, const Snapshot& s,
                std::shared_ptr<const snapshot::ShardBase> base,
                std::shared_ptr<snapshot::CodecGovernor> governor = nullptr,
                bool raw = false, const Snapshot* base_bytes = nullptr) {
  snapshot::ShardWriterOptions options;
  if (base != nullptr && base_bytes != nullptr) {
    // The previous save's bytes in memory, as ckptd has its slot: changed
    // float chunks may be stored as XOR deltas.
    auto with = std::make_shared<snapshot::ShardBase>(*base);
    with->read_raw = [base_bytes](uint32_t item, uint64_t offset,
                                  absl::Span<uint8_t> out) {
      std::memcpy(out.data(), base_bytes->tensors[item].data.data() + offset,
                  out.size());
      return absl::OkStatus();
    };
    base = std::move(with);
  }
  options.base = std::move(base);
  options.governor = std::move(governor);
  if (raw) options.codec.codec = proto::CODEC_NONE;
  const std::string path =
      io::JoinPath(dir, snapshot::ShardFileName(step, 0, ".shard"));
  auto start = std::chrono::steady_clock::now();
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                               {"bench", step, 0, 1}, options);
  for (const Tensor& t : s.tensors) {
    int64_t n =
        static_cast<int64_t>(t.data.size() / snapshot::DTypeSize(t.dtype));
    absl::Status st =
        writer.AddTensor({t.name, t.dtype, {n}, {0}, {n}, t.data});
    if (!st.ok()) Die(std::string(st.message()));
  }
  absl::StatusOr<proto::ShardManifest> m = writer.Commit();
  if (!m.ok()) Die(std::string(m.status().message()));
  Written w;
  w.seconds = Seconds(start);
  w.file_bytes = *io::DefaultFileSystem()->FileSize(path);
  w.as_base = std::make_shared<snapshot::ShardBase>();
  w.as_base->manifest = *std::move(m);
  w.as_base->manifest_xxh3 = writer.manifest_xxh3();
  w.chunks = writer.stats();
  return w;
}

// Reads every tensor of the shard of `step` back and checks it; returns the
// seconds the read took. Like a trainer's tensors, the buffers it reads into
// exist (and are touched) before.
double Restore(const std::string& dir, uint64_t step, const Snapshot& s) {
  const std::string path =
      io::JoinPath(dir, snapshot::ShardFileName(step, 0, ".shard"));
  std::vector<std::vector<uint8_t>> back(s.tensors.size());
  std::vector<snapshot::ShardReader::ItemRead> reads;
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    back[i].resize(s.tensors[i].data.size());
    reads.push_back({s.tensors[i].name, absl::MakeSpan(back[i])});
  }
  auto start = std::chrono::steady_clock::now();
  auto reader = snapshot::ShardReader::Open(io::DefaultFileSystem(), path);
  if (!reader.ok()) Die(std::string(reader.status().message()));
  // As a trainer's restore reads them: every tensor in one pass.
  absl::Status st = (*reader)->ReadItems(reads);
  if (!st.ok()) Die(std::string(st.message()));
  const double seconds = Seconds(start);
  for (size_t i = 0; i < s.tensors.size(); ++i) {
    const Tensor& t = s.tensors[i];
    if (std::memcmp(back[i].data(), t.data.data(), back[i].size()) != 0)
      Die(path + ": " + t.name + " reads back other bytes");
  }
  return seconds;
}

// A chain: the run's first snapshot in full, then each next one over the
// previous shard, with XOR deltas against it when `deltas`. Returns the
// bytes written per save.
std::vector<Written> Chain(const std::string& dir,
                           const std::vector<Snapshot>& run,
                           bool deltas = true) {
  if (absl::Status s = io::DefaultFileSystem()->CreateDirs(dir); !s.ok())
    Die(std::string(s.message()));
  std::vector<Written> out;
  std::shared_ptr<const snapshot::ShardBase> base;
  for (size_t i = 0; i < run.size(); ++i) {
    out.push_back(Persist(dir, run[i].step, run[i], base, nullptr, false,
                          deltas && i > 0 ? &run[i - 1] : nullptr));
    base = out.back().as_base;
  }
  return out;
}

// Saves one step apart: the bytes each save after the first writes with XOR
// deltas, against byte-shuffle + zstd -1 of the same chunks (every chunk of
// dense training changes), and the same chain without deltas.
struct DeltaResult {
  double vs_zstd_shuffle = 0;        // reference bytes over ckpt's, per save
  double vs_no_delta = 0;            // without deltas over with
  double persist_seconds_ratio = 0;  // with deltas over without
  double restore_seconds_ratio = 0;  // the last save: with over without
  uint64_t deltas = 0, chunks = 0;
};
DeltaResult DeltaChain(const std::string& dir,
                       const std::vector<Snapshot>& run) {
  const std::vector<Written> with = Chain(dir + "/x", run, true);
  const std::vector<Written> without = Chain(dir + "/n", run, false);
  DeltaResult r;
  double ref = 0, ckpt = 0, plain = 0, with_s = 0, without_s = 0;
  for (size_t i = 1; i < run.size(); ++i) {
    ref += static_cast<double>(ZstdShuffle(run[i]).stored);
    ckpt += static_cast<double>(with[i].file_bytes);
    plain += static_cast<double>(without[i].file_bytes);
    with_s += with[i].seconds;
    without_s += without[i].seconds;
    r.deltas += with[i].chunks.deltas;
    r.chunks += with[i].chunks.compressed + with[i].chunks.raw_chosen +
                with[i].chunks.raw_incompressible + with[i].chunks.unchanged;
  }
  r.vs_zstd_shuffle = ref / ckpt;
  r.vs_no_delta = plain / ckpt;
  r.persist_seconds_ratio = with_s / without_s;
  (void)std::system("sync");
  const Snapshot& last = run.back();
  r.restore_seconds_ratio = Restore(dir + "/x", last.step, last) /
                            Restore(dir + "/n", last.step, last);
  return r;
}

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

// The bytes of the tensors that differ from the save before, over all of a
// save's, averaged over the saves after the first: what an increment cannot
// leave out.
double ChangedFraction(const std::vector<Snapshot>& run) {
  std::vector<double> fractions;
  for (size_t i = 1; i < run.size(); ++i) {
    uint64_t changed = 0;
    for (size_t t = 0; t < run[i].tensors.size(); ++t) {
      const absl::Span<const uint8_t> now = run[i].tensors[t].data;
      const absl::Span<const uint8_t> before = run[i - 1].tensors[t].data;
      if (now != before) changed += now.size();
    }
    fractions.push_back(static_cast<double>(changed) /
                        static_cast<double>(run[i].raw()));
  }
  return Mean(fractions);
}

}  // namespace

int RunCodec(const std::string& data, const std::string& dir, bool json) {
  if (absl::Status s = io::DefaultFileSystem()->CreateDirs(dir); !s.ok())
    Die(std::string(s.message()));
  // What trainers checkpoint: weights and optimizer state. Gradients are in
  // the data for codec comparisons only.
  const std::vector<Snapshot> fp32 = LoadRun(data, "dense_fp32");
  const std::vector<Snapshot> bf16 = LoadRun(data, "dense_bf16");
  const std::vector<Snapshot> frozen = LoadRun(data, "frozen90", "grad/");
  const std::vector<Snapshot> dense = LoadRun(data, "dense_fp32", "grad/");

  // 1. One full snapshot, one core: ckpt's codec against the reference,
  // the faster of three runs each, alternated.
  CodecResult ref32, ckpt32, ref16, ckpt16;
  for (int i = 0; i < 3; ++i) {
    auto keep = [i](CodecResult& best, const CodecResult& r) {
      if (i == 0) {
        best = r;
        return;
      }
      best.seconds = std::min(best.seconds, r.seconds);
      if (r.decode_seconds > 0) {
        best.decode_seconds = std::min(best.decode_seconds, r.decode_seconds);
      }
    };
    keep(ref32, ZstdShuffle(fp32.back()));
    keep(ckpt32, Ckpt(fp32.back()));
    keep(ref16, ZstdShuffle(bf16.back()));
    keep(ckpt16, Ckpt(bf16.back()));
  }

  // 2. Incremental saves: chains over the fine-tuning and the dense runs.
  const std::string chain_dir = io::JoinPath(dir, "ckpt-bench-codec");
  (void)std::system(("rm -rf '" + chain_dir + "'").c_str());
  if (absl::Status s = io::DefaultFileSystem()->CreateDirs(chain_dir); !s.ok())
    Die(std::string(s.message()));
  const std::vector<Written> frozen_chain =
      Chain(chain_dir + "/f", frozen, /*deltas=*/false);
  std::vector<double> frozen_after;
  for (size_t i = 1; i < frozen_chain.size(); ++i) {
    frozen_after.push_back(static_cast<double>(frozen_chain[i].file_bytes) /
                           static_cast<double>(frozen_chain[0].file_bytes));
  }
  const std::vector<Written> dense_chain =
      Chain(chain_dir + "/d", dense, /*deltas=*/false);
  std::vector<double> dense_after;
  for (size_t i = 1; i < dense_chain.size(); ++i)
    dense_after.push_back(static_cast<double>(dense_chain[i].file_bytes));
  const double incremental_ratio_dense =
      static_cast<double>(dense_chain[0].file_bytes) / Mean(dense_after);

  // Saves one step apart (a trainer saving every step), with XOR deltas.
  const DeltaResult delta32 =
      DeltaChain(chain_dir + "/s32", LoadRun(data, "steps_fp32", "grad/"));
  const DeltaResult delta16 =
      DeltaChain(chain_dir + "/s16", LoadRun(data, "steps_bf16", "grad/"));
  const std::vector<Snapshot> frozen_steps =
      LoadRun(data, "frozen90_steps", "grad/");
  const std::vector<Written> frozen_steps_chain =
      Chain(chain_dir + "/fs", frozen_steps);
  std::vector<double> frozen_steps_after;
  for (size_t i = 1; i < frozen_steps_chain.size(); ++i) {
    frozen_steps_after.push_back(
        static_cast<double>(frozen_steps_chain[i].file_bytes) /
        static_cast<double>(frozen_steps_chain[0].file_bytes));
  }

  // 3. Throughput against fio, same run: persisting full snapshots of float
  // state (at least 256 MiB: the fp32 snapshot tiled), compressing every
  // chunk and under the adaptive codec over successive saves, as a daemon
  // persists them; restoring the end of the fine-tuning chain.
  const uint64_t raw32 = fp32.back().raw();
  const Snapshot big = Tiled(fp32.back(), uint64_t{256} << 20);
  const uint64_t fio_mib = big.raw() >> 20;
  const unsigned iodepth = io::PosixFsOptions{}.queue_depth;
  const std::string fio_file = io::JoinPath(dir, "ckpt-bench-fio.dat");
  const double fio_write = Fio(fio_file, true, fio_mib, iodepth);
  auto mib_s = [&](const Written& w) {
    return static_cast<double>(big.raw()) / (1 << 20) / w.seconds;
  };
  const Written zstd_all = Persist(chain_dir, 1'000'000, big, nullptr);
  const Written raw_all =
      Persist(chain_dir, 999'999, big, nullptr, nullptr, /*raw=*/true);
  auto governor = std::make_shared<snapshot::CodecGovernor>(
      snapshot::CodecGovernorOptions{});
  std::vector<Written> adaptive;
  for (uint64_t i = 0; i < 3; ++i) {
    adaptive.push_back(
        Persist(chain_dir, 1'000'001 + i, big, nullptr, governor));
  }
  const Written& full = adaptive.back();
  const double persist_mib_s = mib_s(full);
  const double fio_read = Fio(fio_file, false, fio_mib, iodepth);
  (void)io::DefaultFileSystem()->Unlink(fio_file);
  // The restore reads a rank's share of a larger model: the fine-tuning
  // chain with each snapshot tiled like the persisted one.
  std::vector<Snapshot> frozen_big;
  for (const Snapshot& s : frozen)
    frozen_big.push_back(Tiled(s, uint64_t{256} << 20));
  (void)Chain(chain_dir + "/fbig", frozen_big);
  const Snapshot& last = frozen_big.back();
  (void)std::system("sync");
  const double restore_mib_s = static_cast<double>(last.raw()) / (1 << 20) /
                               Restore(chain_dir + "/fbig", last.step, last);
  (void)std::system(("rm -rf '" + chain_dir + "'").c_str());

  nlohmann::json j;
  j["data"] = data;
  j["snapshot_bytes_fp32"] = raw32;
  j["snapshot_bytes_bf16"] = bf16.back().raw();
  j["zstd_shuffle_stored_fp32"] = ref32.stored;
  j["ckpt_stored_fp32"] = ckpt32.stored;
  j["zstd_shuffle_stored_bf16"] = ref16.stored;
  j["ckpt_stored_bf16"] = ckpt16.stored;
  j["ratio_vs_zstd_shuffle_fp32"] =
      static_cast<double>(ref32.stored) / static_cast<double>(ckpt32.stored);
  j["ratio_vs_zstd_shuffle_bf16"] =
      static_cast<double>(ref16.stored) / static_cast<double>(ckpt16.stored);
  j["speed_vs_zstd_shuffle"] =
      (ref32.seconds + ref16.seconds) / (ckpt32.seconds + ckpt16.seconds);
  j["codec_mib_s_fp32"] =
      static_cast<double>(raw32) / (1 << 20) / ckpt32.seconds;
  j["decode_mib_s_fp32"] =
      static_cast<double>(raw32) / (1 << 20) / ckpt32.decode_seconds;
  j["frozen90_full_bytes"] = frozen_chain[0].file_bytes;
  j["incremental_bytes_frozen90"] = Mean(frozen_steps_after);
  j["incremental_bytes_frozen90_every10"] = Mean(frozen_after);
  j["changed_bytes_fraction_frozen90"] = ChangedFraction(frozen_steps);
  j["incremental_vs_changed_frozen90"] =
      Mean(frozen_steps_after) / ChangedFraction(frozen_steps);
  j["delta_vs_zstd_shuffle_fp32"] = delta32.vs_zstd_shuffle;
  j["delta_vs_zstd_shuffle_bf16"] = delta16.vs_zstd_shuffle;
  j["delta_vs_no_delta_fp32"] = delta32.vs_no_delta;
  j["delta_vs_no_delta_bf16"] = delta16.vs_no_delta;
  j["delta_chunks_fraction_fp32"] =
      static_cast<double>(delta32.deltas) / static_cast<double>(delta32.chunks);
  j["delta_chunks_fraction_bf16"] =
      static_cast<double>(delta16.deltas) / static_cast<double>(delta16.chunks);
  j["delta_persist_seconds_vs_no_delta_fp32"] = delta32.persist_seconds_ratio;
  j["delta_persist_seconds_vs_no_delta_bf16"] = delta16.persist_seconds_ratio;
  j["delta_restore_seconds_vs_no_delta_fp32"] = delta32.restore_seconds_ratio;
  j["delta_restore_seconds_vs_no_delta_bf16"] = delta16.restore_seconds_ratio;
  j["dense_full_bytes"] = dense_chain[0].file_bytes;
  j["incremental_ratio_dense"] = incremental_ratio_dense;
  j["fio_write_mib_s"] = fio_write;
  j["persist_bytes_float"] = big.raw();
  j["persist_mib_s_float"] = persist_mib_s;
  j["persist_vs_fio_float"] = persist_mib_s / fio_write;
  j["persist_first_vs_fio_float"] = mib_s(adaptive.front()) / fio_write;
  j["persist_zstd_all_vs_fio_float"] = mib_s(zstd_all) / fio_write;
  j["persist_raw_vs_fio_float"] = mib_s(raw_all) / fio_write;
  j["persist_vs_raw_float"] = persist_mib_s / mib_s(raw_all);
  j["persist_stored_fraction_float"] =
      static_cast<double>(full.file_bytes) / static_cast<double>(big.raw());
  j["persist_zstd_all_stored_fraction_float"] =
      static_cast<double>(zstd_all.file_bytes) / static_cast<double>(big.raw());
  const std::vector<Snapshot> bf16_state = LoadRun(data, "dense_bf16", "grad/");
  j["xor_delta_gain_dense_fp32_previous"] = XorDeltaGain(dense, true);
  j["xor_delta_gain_dense_fp32_chain_start"] = XorDeltaGain(dense, false);
  j["xor_delta_gain_dense_bf16_previous"] = XorDeltaGain(bf16_state, true);
  j["xor_delta_gain_dense_bf16_chain_start"] = XorDeltaGain(bf16_state, false);
  j["xor_delta_gain_frozen90_previous"] = XorDeltaGain(frozen, true);
  j["xor_delta_gain_frozen90_chain_start"] = XorDeltaGain(frozen, false);
  j["codec_effort"] = governor->stats().effort;
  j["codec_raw_mib_s"] = governor->stats().raw_mib_s;
  j["codec_windows"] = governor->stats().windows;
  j["codec_probes"] = governor->stats().probes;
  j["persist_chunks_compressed"] = full.chunks.compressed;
  j["persist_chunks_raw_chosen"] = full.chunks.raw_chosen;
  j["fio_read_mib_s"] = fio_read;
  j["restore_mib_s_incremental"] = restore_mib_s;
  j["restore_vs_fio_incremental"] = restore_mib_s / fio_read;
  j["chain_length"] = frozen.size();
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf(
      "codec, one full fp32 snapshot (%.1f MiB): ckpt %.3f of raw, "
      "shuffle+zstd-1 %.3f (ratio %.3f); bf16: ratio %.3f; speed vs "
      "shuffle+zstd-1 %.2f\n",
      raw32 / 1048576.0,
      static_cast<double>(ckpt32.stored) / static_cast<double>(raw32),
      static_cast<double>(ref32.stored) / static_cast<double>(raw32),
      j["ratio_vs_zstd_shuffle_fp32"].get<double>(),
      j["ratio_vs_zstd_shuffle_bf16"].get<double>(),
      j["speed_vs_zstd_shuffle"].get<double>());
  std::printf(
      "incremental: fine-tuning (frozen) writes %.3f of a full save per "
      "save; dense training %.2fx less than full\n",
      Mean(frozen_steps_after), incremental_ratio_dense);
  std::printf(
      "XOR deltas, saves one step apart: %.3f (fp32) and %.3f (bf16) of "
      "shuffle+zstd-1's bytes; %.2fx and %.2fx smaller than without deltas; "
      "persist %.2fx and restore %.2fx the time without (fp32)\n",
      1 / delta32.vs_zstd_shuffle, 1 / delta16.vs_zstd_shuffle,
      delta32.vs_no_delta, delta16.vs_no_delta, delta32.persist_seconds_ratio,
      delta32.restore_seconds_ratio);
  std::printf(
      "persist %.0f MiB of floats: adaptive %.0f MiB/s (%.3f stored, %llu of "
      "%llu chunks compressed, effort %.2f), compressing all %.0f MiB/s "
      "(%.3f stored), raw %.0f MiB/s, vs fio write %.0f (%.2f, %.2f and "
      "%.2f)\n",
      big.raw() / 1048576.0, persist_mib_s,
      j["persist_stored_fraction_float"].get<double>(),
      static_cast<unsigned long long>(full.chunks.compressed),
      static_cast<unsigned long long>(full.chunks.compressed +
                                      full.chunks.raw_chosen +
                                      full.chunks.raw_incompressible),
      governor->stats().effort, mib_s(zstd_all),
      j["persist_zstd_all_stored_fraction_float"].get<double>(), mib_s(raw_all),
      fio_write, persist_mib_s / fio_write, mib_s(zstd_all) / fio_write,
      mib_s(raw_all) / fio_write);
  std::printf(
      "restore at the end of a chain of %zu: %.0f MiB/s vs fio read %.0f "
      "(%.2f)\n",
      frozen.size(), restore_mib_s, fio_read, restore_mib_s / fio_read);
  return 0;
}

}  // namespace ckpt::bench
