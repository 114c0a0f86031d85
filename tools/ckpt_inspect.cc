// ckpt inspect: a shard file's header and items, or a step of a job.

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "snapshot/shard_reader.h"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

int Inspect(const std::string& path, bool json, io::FileSystem* fs) {
  if (fs == nullptr) fs = ckpt::io::DefaultFileSystem();
  auto reader = ShardReader::Open(fs, path);
  if (!reader.ok()) {
    std::cerr << "ckpt inspect: " << reader.status().message() << "\n";
    return 1;
  }
  const proto::ShardManifest& m = (*reader)->manifest();
  nlohmann::json j;
  j["path"] = path;
  j["format_version"] = m.format_version();
  j["job"] = m.job();
  j["step"] = m.step();
  j["rank"] = m.rank();
  j["world_size"] = m.world_size();
  j["chunk_size"] = m.chunk_size();
  j["file_size"] = (*reader)->file_size();
  j["created_unix_micros"] = m.created_unix_micros();
  uint64_t raw = 0, stored = 0;
  j["items"] = nlohmann::json::array();
  for (const proto::Item& item : m.items()) {
    nlohmann::json ij = ItemJson(item);
    raw += ij["raw_size"].get<uint64_t>();
    stored += ij["stored_size"].get<uint64_t>();
    j["items"].push_back(std::move(ij));
  }
  j["raw_bytes"] = raw;
  j["stored_bytes"] = stored;
  j["increments"] = m.increments();
  j["bases"] = nlohmann::json::array();
  for (uint32_t k = 1; k <= static_cast<uint32_t>(m.bases_size()); ++k) {
    nlohmann::json bj;
    bj["step"] = m.bases(static_cast<int>(k) - 1).step();
    absl::StatusOr<std::string> base_path = (*reader)->BasePath(k);
    if (base_path.ok()) bj["path"] = *base_path;
    j["bases"].push_back(std::move(bj));
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("shard %s\n", path.c_str());
  std::printf(
      "  format v%u  job %s  step %lu  rank %u of %u  chunk size %u  file %lu "
      "bytes\n",
      m.format_version(), m.job().empty() ? "-" : m.job().c_str(),
      static_cast<unsigned long>(m.step()), m.rank(), m.world_size(),
      m.chunk_size(), static_cast<unsigned long>((*reader)->file_size()));
  std::printf(
      "  %d items, %lu raw bytes, %lu stored (ratio %.3f)\n", m.items_size(),
      static_cast<unsigned long>(raw), static_cast<unsigned long>(stored),
      raw == 0 ? 1.0 : static_cast<double>(stored) / static_cast<double>(raw));
  if (m.bases_size() > 0) {
    std::vector<uint64_t> steps;
    for (const proto::BaseShard& b : m.bases()) steps.push_back(b.step());
    std::printf(
        "  incremental: save %u since the last full one; unchanged chunks "
        "stay in steps %s\n",
        m.increments(), absl::StrJoin(steps, ", ").c_str());
  }
  for (const nlohmann::json& ij : j["items"]) {
    const proto::Item* item =
        *(*reader)->FindItem(ij["name"].get<std::string>());
    std::string what =
        item->kind() == proto::ITEM_KIND_TENSOR
            ? absl::StrCat(ckpt::snapshot::DTypeName(item->dtype()), " ",
                           Dims(item->global_shape()), " box ",
                           Dims(item->box_offset()), "+",
                           Dims(item->box_length()))
            : "bytes";
    const int in_bases = ij["chunks_in_bases"].get<int>();
    const int deltas = ij["xor_delta_chunks"].get<int>();
    std::printf(
        "  %-40s %-44s raw %10lu stored %10lu chunks %d %s%s%s\n",
        item->name().c_str(), what.c_str(),
        static_cast<unsigned long>(item->raw_size()),
        static_cast<unsigned long>(ij["stored_size"].get<uint64_t>()),
        item->chunks_size(), ij["codecs"].dump().c_str(),
        in_bases == 0
            ? ""
            : absl::StrCat(" (", in_bases, " unchanged, in bases)").c_str(),
        deltas == 0 ? ""
                    : absl::StrCat(" (", deltas, " XOR deltas, depth <= ",
                                   ij["xor_max_depth"].get<uint32_t>(), ")")
                          .c_str());
  }
  return 0;
}

int InspectStep(const std::string& data_dir, const std::string& socket_path,
                const std::string& job, const std::string& step_text,
                bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("inspect", step.status());
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("inspect", view.status());
  auto shards = (*view)->StepShards(job, *step);
  if (!shards.ok()) return Fail("inspect", shards.status());
  nlohmann::json j;
  j["job"] = job;
  j["step"] = *step;
  j["world_size"] = shards->front().world_size();
  auto suspects = DaemonSuspects(socket_path, job);
  if (!suspects.ok()) return Fail("inspect", suspects.status());
  for (const proto::ReplicaCheck& c : *suspects) {
    if (c.step() == *step) j["suspect"] = SuspectJson(c);
  }
  j["ranks"] = nlohmann::json::array();
  for (const proto::ShardRecord& r : *shards) {
    nlohmann::json rj;
    rj["rank"] = r.rank();
    rj["state"] = proto::ShardState_Name(r.state());
    if (!r.shard_path().empty()) rj["shard_path"] = r.shard_path();
    if (!r.slot_path().empty()) rj["slot_path"] = r.slot_path();
    if (!r.error().empty()) rj["error"] = r.error();
    // A newer save of the rank took its place on the disk (--persist-newest).
    if (r.persist_skipped()) rj["persist_skipped"] = true;
    rj["items"] = nlohmann::json::array();
    // The persisted manifest has chunk and codec figures; a shard only in
    // memory has the trainer's description of its items.
    absl::StatusOr<std::unique_ptr<ShardReader>> reader =
        r.state() == proto::SHARD_PERSISTED && !r.shard_path().empty()
            ? ShardReader::Open(ckpt::io::DefaultFileSystem(), r.shard_path())
            : absl::StatusOr<std::unique_ptr<ShardReader>>(
                  absl::NotFoundError("not persisted"));
    if (reader.ok()) {
      for (const proto::Item& item : (*reader)->manifest().items())
        rj["items"].push_back(ItemJson(item));
    } else {
      if (r.state() == proto::SHARD_PERSISTED)
        rj["error"] = std::string(reader.status().message());
      for (const proto::StagedItem& staged : r.items())
        rj["items"].push_back(ItemJson(staged.item()));
    }
    j["ranks"].push_back(std::move(rj));
  }
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("job %s step %lu, world size %u\n", job.c_str(),
              static_cast<unsigned long>(*step), shards->front().world_size());
  // Tensors across ranks: name -> rank boxes.
  std::map<std::string, std::vector<std::string>> boxes;
  std::map<std::string, std::string> kinds;
  for (const nlohmann::json& rj : j["ranks"]) {
    std::printf("  rank %u: %s%s%s%s\n", rj["rank"].get<uint32_t>(),
                rj["state"].get<std::string>().c_str(),
                rj.contains("shard_path") ? ", on disk" : "",
                rj.contains("slot_path") ? ", in memory" : "",
                rj.contains("persist_skipped")
                    ? ", not persisted (a newer save came first)"
                    : "");
    if (rj.contains("error"))
      std::printf("    error: %s\n", rj["error"].get<std::string>().c_str());
    for (const nlohmann::json& ij : rj["items"]) {
      const std::string name = ij["name"];
      if (ij["kind"] == "tensor") {
        kinds[name] = absl::StrCat(ij["dtype"].get<std::string>(), " ",
                                   ij["global_shape"].dump());
        boxes[name].push_back(absl::StrCat("r", rj["rank"].get<uint32_t>(), ":",
                                           ij["box_offset"].dump(), "+",
                                           ij["box_length"].dump()));
      } else {
        kinds[name] = "bytes";
        boxes[name].push_back(
            absl::StrCat("r", rj["rank"].get<uint32_t>(), ":",
                         HumanBytes(ij["raw_size"].get<uint64_t>())));
      }
      std::printf("    %-36s raw %10s stored %10s chunks %4d %s\n",
                  name.c_str(),
                  HumanBytes(ij["raw_size"].get<uint64_t>()).c_str(),
                  HumanBytes(ij["stored_size"].get<uint64_t>()).c_str(),
                  ij["chunks"].get<int>(), ij["codecs"].dump().c_str());
    }
  }
  for (const proto::ReplicaCheck& c : *suspects) {
    if (c.step() == *step) std::printf("  %s\n", SuspectLine(c).c_str());
  }
  std::printf("  items and their sharding:\n");
  for (const auto& [name, parts] : boxes) {
    std::printf("    %-36s %-28s %s\n", name.c_str(), kinds[name].c_str(),
                absl::StrJoin(parts, " ").c_str());
  }
  return 0;
}

}  // namespace ckpt::cli
