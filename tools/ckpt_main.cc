// ckpt: the operators' command. This foundation provides `inspect` and `verify`
// of shard files; the catalog-backed commands (ls, gc, status, export, restore)
// arrive with the daemon.
#include <cstdio>
#include <iostream>
#include <map>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "snapshot/shard_reader.h"

namespace {

using ckpt::snapshot::ShardReader;
namespace proto = ckpt::proto;

std::string CodecName(proto::Codec c) {
  switch (c) {
    case proto::CODEC_NONE:
      return "none";
    case proto::CODEC_ZSTD:
      return "zstd";
    default:
      return absl::StrCat("unknown(", static_cast<int>(c), ")");
  }
}

std::string Dims(const google::protobuf::RepeatedField<int64_t>& dims) {
  return absl::StrCat("[", absl::StrJoin(dims, ","), "]");
}

nlohmann::json ItemJson(const proto::Item& item) {
  nlohmann::json j;
  j["name"] = item.name();
  j["kind"] = item.kind() == proto::ITEM_KIND_TENSOR ? "tensor" : "bytes";
  if (item.kind() == proto::ITEM_KIND_TENSOR) {
    j["dtype"] = ckpt::snapshot::DTypeName(item.dtype());
    j["global_shape"] = std::vector<int64_t>(item.global_shape().begin(),
                                             item.global_shape().end());
    j["box_offset"] = std::vector<int64_t>(item.box_offset().begin(),
                                           item.box_offset().end());
    j["box_length"] = std::vector<int64_t>(item.box_length().begin(),
                                           item.box_length().end());
  }
  uint64_t stored = 0;
  std::map<std::string, int> codecs;
  for (const proto::ChunkInfo& c : item.chunks()) {
    stored += c.stored_size();
    std::string key = CodecName(c.codec());
    if (c.filter() == proto::FILTER_BYTE_SHUFFLE) key += "+shuffle";
    ++codecs[key];
  }
  j["raw_size"] = item.raw_size();
  j["stored_size"] = stored;
  j["chunks"] = item.chunks_size();
  j["codecs"] = codecs;
  return j;
}

int Inspect(const std::string& path, bool json) {
  auto reader = ShardReader::Open(ckpt::io::DefaultFileSystem(), path);
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
    std::printf("  %-40s %-44s raw %10lu stored %10lu chunks %d %s\n",
                item->name().c_str(), what.c_str(),
                static_cast<unsigned long>(item->raw_size()),
                static_cast<unsigned long>(ij["stored_size"].get<uint64_t>()),
                item->chunks_size(), ij["codecs"].dump().c_str());
  }
  return 0;
}

int Verify(const std::vector<std::string>& paths, bool json) {
  int bad_files = 0;
  nlohmann::json out = nlohmann::json::array();
  for (const std::string& path : paths) {
    auto reader = ShardReader::Open(ckpt::io::DefaultFileSystem(), path);
    std::vector<absl::Status> errors;
    int chunks = 0;
    if (!reader.ok()) {
      errors.push_back(reader.status());
    } else {
      for (const proto::Item& item : (*reader)->manifest().items())
        chunks += item.chunks_size();
      errors = (*reader)->VerifyAll();
    }
    if (!errors.empty()) ++bad_files;
    nlohmann::json j;
    j["path"] = path;
    j["ok"] = errors.empty();
    j["chunks"] = chunks;
    j["errors"] = nlohmann::json::array();
    for (const absl::Status& e : errors)
      j["errors"].push_back(std::string(e.message()));
    if (!json) {
      for (const absl::Status& e : errors)
        std::printf("BAD %s\n", std::string(e.message()).c_str());
      if (errors.empty())
        std::printf("OK  %s: %d chunks verified\n", path.c_str(), chunks);
    }
    out.push_back(std::move(j));
  }
  if (json) std::cout << (paths.size() == 1 ? out[0] : out).dump(2) << "\n";
  return bad_files == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ckpt: inspect and verify checkpoint shards"};
  app.require_subcommand(1);
  bool json = false;

  std::string inspect_path;
  CLI::App* inspect =
      app.add_subcommand("inspect", "show what a shard file holds");
  inspect->add_option("path", inspect_path, "shard file")->required();
  inspect->add_flag("--json", json, "print one JSON object");

  std::vector<std::string> verify_paths;
  CLI::App* verify = app.add_subcommand(
      "verify",
      "check every chunk of shard files; exit 1 and a line per bad chunk");
  verify->add_option("paths", verify_paths, "shard files")->required();
  verify->add_flag("--json", json, "print JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (*inspect) return Inspect(inspect_path, json);
  if (*verify) return Verify(verify_paths, json);
  return 2;
}
