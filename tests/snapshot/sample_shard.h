// A small, deterministic shard for the corruption and crash tests: a few
// tensors of different dtypes (compressible and not, several chunks each with a
// small chunk size; one page-aligned in memory, so its chunks are stored in
// place) and a byte item.
#ifndef CKPT_TESTS_SNAPSHOT_SAMPLE_SHARD_H_
#define CKPT_TESTS_SNAPSHOT_SAMPLE_SHARD_H_

#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "io/aligned_buffer.h"
#include "io/file_system.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"

namespace ckpt::testing {

struct SampleShard {
  // name -> raw bytes
  std::map<std::string, std::vector<uint8_t>> items;

  explicit SampleShard(uint64_t seed, size_t scale = 1) {
    std::mt19937_64 rng(seed);
    auto floats = [&](size_t n) {
      std::vector<uint8_t> v(n * 4);
      std::normal_distribution<float> d(0, 0.02f);
      for (size_t i = 0; i < n; ++i) {
        float f = d(rng);
        std::memcpy(&v[i * 4], &f, 4);
      }
      return v;
    };
    items["w"] =
        floats(6000 * scale);  // 24 KB: several 8 KiB chunks, compressible
    std::vector<uint8_t> noise(10000 * scale);
    for (auto& b : noise) b = static_cast<uint8_t>(rng());
    items["noise"] = noise;  // incompressible: stored raw
    items["rng"] = std::vector<uint8_t>{1, 2, 3, 4, 5, 6, 7};
    // Three whole chunks stored in place and a short last one copied.
    std::vector<uint8_t> page(3 * 8192 + 100);
    for (auto& b : page) b = static_cast<uint8_t>(rng());
    aligned = io::AlignedBuffer(page.size());
    std::memcpy(aligned.data(), page.data(), page.size());
    items["page"] = std::move(page);
  }

  io::AlignedBuffer aligned;  // items["page"], page aligned

  // With `base_path`, an incremental save over the shard there: chunks that
  // did not change are left where it stores them.
  absl::Status Write(io::FileSystem* fs, const std::string& path, uint64_t step,
                     const std::string& base_path = "") const {
    snapshot::ShardWriterOptions options;
    if (!base_path.empty()) {
      auto base = snapshot::ShardReader::Open(fs, base_path);
      if (!base.ok()) return base.status();
      auto b = std::make_shared<snapshot::ShardBase>();
      b->manifest = (*base)->manifest();
      b->manifest_xxh3 = snapshot::Checksum(absl::MakeConstSpan(
          reinterpret_cast<const uint8_t*>((*base)->manifest_bytes().data()),
          (*base)->manifest_bytes().size()));
      options.base = std::move(b);
    }
    options.chunk_size = 8192;
    options.codec.min_in_place_bytes = 8192;
    snapshot::ShardWriter writer(fs, path, {"job", step, 0, 1}, options);
    const auto& w = items.at("w");
    int64_t n = static_cast<int64_t>(w.size() / 4);
    absl::Status s = writer.AddTensor(
        {"w", proto::DTYPE_FLOAT32, {n * 2}, {n}, {n}, absl::MakeConstSpan(w)});
    if (s.ok()) {
      const auto& noise = items.at("noise");
      int64_t m = static_cast<int64_t>(noise.size() / 2);
      s = writer.AddTensor({"noise",
                            proto::DTYPE_UINT16,
                            {m},
                            {0},
                            {m},
                            absl::MakeConstSpan(noise)});
    }
    if (s.ok()) s = writer.AddBytes("rng", items.at("rng"));
    if (s.ok()) {
      const int64_t n = static_cast<int64_t>(aligned.size());
      s = writer.AddTensor(
          {"page", proto::DTYPE_UINT8, {n}, {0}, {n}, aligned.span()});
    }
    if (!s.ok()) return s;
    return writer.Commit().status();
  }

  // OK when `path` reads back exactly these items with every chunk verified.
  absl::Status Check(io::FileSystem* fs, const std::string& path) const {
    auto reader = snapshot::ShardReader::Open(fs, path);
    if (!reader.ok()) return reader.status();
    for (const auto& [name, bytes] : items) {
      std::vector<uint8_t> back(bytes.size());
      absl::Status s = (*reader)->ReadItem(name, absl::MakeSpan(back));
      if (!s.ok()) return s;
      if (back != bytes)
        return absl::DataLossError("item " + name + " differs");
    }
    std::vector<absl::Status> errors = (*reader)->VerifyAll();
    return errors.empty() ? absl::OkStatus() : errors[0];
  }
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_SNAPSHOT_SAMPLE_SHARD_H_
