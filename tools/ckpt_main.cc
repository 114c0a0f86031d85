// ckpt: the operators' command. It reads a ckptd data directory directly (the
// catalog opened read-only, which works whether or not ckptd runs): `ls`,
// `inspect`, `verify` and `export`; `inspect` and `verify` also take shard
// files. Exit codes: 0 good, 1 a check found problems or an operation failed,
// 2 bad usage, 3 what was asked for does not exist (data directory, job, step).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/daemon_admin.h"
#include "daemon/coordinator.h"
#include "daemon/retention.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/box.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "tools/data_dir_view.h"
#include "tools/export.h"
#include "tools/metrics_text.h"

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

constexpr int kExitProblems = 1;
constexpr int kExitUsage = 2;
constexpr int kExitNotFound = 3;

int Fail(absl::string_view command, const absl::Status& s) {
  std::cerr << "ckpt " << command << ": " << s.message() << "\n";
  return s.code() == absl::StatusCode::kNotFound ? kExitNotFound
                                                 : kExitProblems;
}

int UsageError(absl::string_view command, const absl::Status& s) {
  std::cerr << "ckpt " << command << ": " << s.message() << "\n";
  return kExitUsage;
}

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 5) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}

std::string Age(int64_t unix_micros) {
  if (unix_micros <= 0) return "-";
  const int64_t now = std::chrono::duration_cast<std::chrono::microseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  int64_t s = std::max<int64_t>(0, (now - unix_micros) / 1000000);
  if (s < 120) return absl::StrCat(s, "s ago");
  if (s < 7200) return absl::StrCat(s / 60, "m ago");
  if (s < 2 * 86400) return absl::StrCat(s / 3600, "h ago");
  return absl::StrCat(s / 86400, "d ago");
}

// A one-line progress bar on stderr, only when stdout is a terminal (a script
// reading the output gets none).
class Progress {
 public:
  explicit Progress(std::string label)
      : label_(std::move(label)), on_(::isatty(STDOUT_FILENO) == 1) {}
  ~Progress() {
    if (on_ && shown_) std::fprintf(stderr, "\r\033[K");
  }
  void Update(int done, int total) {
    if (!on_ || total <= 0) return;
    const int width = 30, filled = width * done / total;
    std::fprintf(stderr, "\r%s [%s%s] %d/%d", label_.c_str(),
                 std::string(filled, '#').c_str(),
                 std::string(width - filled, ' ').c_str(), done, total);
    shown_ = true;
  }

 private:
  const std::string label_;
  const bool on_;
  bool shown_ = false;
};

absl::StatusOr<uint64_t> ParseStep(const std::string& text) {
  uint64_t step;
  if (!absl::SimpleAtoi(text, &step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("step \"", text, "\" is not a number"));
  }
  return step;
}

nlohmann::json StepJson(const ckpt::tools::StepSummary& s) {
  nlohmann::json j;
  j["step"] = s.step;
  j["world_size"] = s.world_size;
  j["ranks_in_memory"] = s.ranks_in_memory;
  j["ranks_on_peers"] = s.ranks_on_peers;
  j["ranks_on_disk"] = s.ranks_on_disk;
  j["ranks_failed"] = s.ranks_failed;
  std::vector<std::string> tiers;
  for (proto::Tier t : s.committed) tiers.push_back(ckpt::daemon::TierName(t));
  j["committed"] = tiers;
  j["raw_bytes"] = s.raw_bytes;
  j["stored_bytes"] = s.stored_bytes;
  j["newest_unix_micros"] = s.newest_unix_micros;
  return j;
}

// Per tier: "committed", "k/N" ranks of this node there, or "-".
std::string TierCell(const ckpt::tools::StepSummary& s, proto::Tier tier,
                     uint32_t ranks) {
  for (proto::Tier t : s.committed) {
    if (t == tier) return "committed";
  }
  if (ranks == 0) return "-";
  return absl::StrCat(ranks, "/", s.world_size);
}

// Where the ckptd of `data_dir` listens: what it recorded there when it
// started, else ckptd's default socket.
std::string DaemonSocketOf(const std::string& data_dir) {
  absl::optional<ckpt::tools::DaemonRecord> d =
      ckpt::tools::ReadDaemonRecord(data_dir);
  if (d.has_value() && !d->socket.empty()) return d->socket;
  return absl::StrCat("/tmp/ckpt-", ::getuid(), "/ckptd.sock");
}

// The tiers `ckpt ls` shows, in the order data moves through them.
constexpr proto::Tier kLsTiers[] = {proto::TIER_MEMORY, proto::TIER_PEER,
                                    proto::TIER_LOCAL_DISK, proto::TIER_SHARED};

// The commit records of `job` as the running ckptd's coordinator has them
// (etcd's for a node of a cluster: commits other nodes' votes made
// included); nullopt when no ckptd answers at `socket_path`.
absl::StatusOr<std::optional<std::vector<proto::CommitRecord>>> DaemonCommits(
    const std::string& socket_path, const std::string& job) {
  proto::ListCommitsRequest req;
  req.set_job(job);
  auto resp = ckpt::client::CallDaemon<proto::ListCommitsRequest,
                                       proto::ListCommitsResponse>(
      socket_path, &proto::CkptDaemon::Stub::ListCommits, req,
      "listing the commits of job " + job, std::chrono::seconds(10));
  if (absl::IsUnavailable(resp.status())) return std::nullopt;
  if (!resp.ok()) return resp.status();
  return std::vector<proto::CommitRecord>(resp->commits().begin(),
                                          resp->commits().end());
}

int Ls(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, bool json) {
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("ls", view.status());
  std::vector<std::string> jobs;
  if (job.empty()) {
    auto records = (*view)->Jobs();
    if (!records.ok()) return Fail("ls", records.status());
    for (const proto::JobRecord& r : *records) jobs.push_back(r.job());
  } else {
    auto record = (*view)->Job(job);
    if (!record.ok()) return Fail("ls", record.status());
    jobs.push_back(job);
  }
  nlohmann::json out = nlohmann::json::array();
  bool from_daemon = true;
  for (const std::string& name : jobs) {
    auto commits = DaemonCommits(socket_path, name);
    if (!commits.ok()) return Fail("ls", commits.status());
    from_daemon = commits->has_value();
    auto steps = (*view)->Steps(name, from_daemon ? &**commits : nullptr);
    if (!steps.ok()) return Fail("ls", steps.status());
    nlohmann::json j;
    j["job"] = name;
    j["commits_from"] = from_daemon ? "ckptd" : "data_dir";
    j["steps"] = nlohmann::json::array();
    for (const auto& s : *steps) j["steps"].push_back(StepJson(s));
    if (json) {
      out.push_back(std::move(j));
      continue;
    }
    if (job.empty()) {
      // One line per job: how many steps, the newest committed per tier.
      std::map<proto::Tier, uint64_t> latest;
      uint32_t world = 0;
      for (const auto& s : *steps) {
        world = std::max(world, s.world_size);
        for (proto::Tier t : s.committed) latest[t] = s.step;
      }
      std::vector<std::string> cells;
      for (proto::Tier t : kLsTiers) {
        auto it = latest.find(t);
        if (it == latest.end() &&
            (t == proto::TIER_PEER || t == proto::TIER_SHARED)) {
          continue;  // a tier this job does not use
        }
        cells.push_back(absl::StrCat(
            ckpt::daemon::TierName(t) == "local_disk"
                ? "disk"
                : ckpt::daemon::TierName(t),
            " ", it == latest.end() ? "-" : absl::StrCat(it->second)));
      }
      std::printf("%-24s world %-5u %4zu steps  latest committed: %s\n",
                  name.c_str(), world, steps->size(),
                  absl::StrJoin(cells, ", ").c_str());
      continue;
    }
    std::printf("job %s (%s)\n", name.c_str(), data_dir.c_str());
    std::printf("  %10s %6s %-10s %-10s %-10s %-10s %-7s %10s %10s  %s\n",
                "step", "world", "memory", "peer", "disk", "shared", "failed",
                "raw", "stored", "age");
    for (const auto& s : *steps) {
      std::printf(
          "  %10lu %6u %-10s %-10s %-10s %-10s %-7s %10s %10s  %s\n",
          static_cast<unsigned long>(s.step), s.world_size,
          TierCell(s, proto::TIER_MEMORY, s.ranks_in_memory).c_str(),
          TierCell(s, proto::TIER_PEER, s.ranks_on_peers).c_str(),
          TierCell(s, proto::TIER_LOCAL_DISK, s.ranks_on_disk).c_str(),
          TierCell(s, proto::TIER_SHARED, 0).c_str(),
          s.ranks_failed == 0 ? "-" : absl::StrCat(s.ranks_failed).c_str(),
          s.ranks_on_disk ? HumanBytes(s.raw_bytes).c_str() : "-",
          s.ranks_on_disk ? HumanBytes(s.stored_bytes).c_str() : "-",
          Age(s.newest_unix_micros).c_str());
    }
  }
  if (!json && !jobs.empty()) {
    std::printf(
        from_daemon
            ? "(commits: ckptd's coordinator, via %s; ranks k/N: this node's "
              "shards)\n"
            : "(commits: the data directory's records, ckptd not reachable at "
              "%s; a node on etcd keeps its commits there, not here)\n",
        socket_path.c_str());
  }
  if (json) std::cout << (job.empty() ? out : out[0]).dump(2) << "\n";
  return 0;
}

// `ckpt inspect JOB STEP`: the step's tensors with how they are sharded.
int InspectStep(const std::string& data_dir, const std::string& job,
                const std::string& step_text, bool json) {
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
  j["ranks"] = nlohmann::json::array();
  for (const proto::ShardRecord& r : *shards) {
    nlohmann::json rj;
    rj["rank"] = r.rank();
    rj["state"] = proto::ShardState_Name(r.state());
    if (!r.shard_path().empty()) rj["shard_path"] = r.shard_path();
    if (!r.slot_path().empty()) rj["slot_path"] = r.slot_path();
    if (!r.error().empty()) rj["error"] = r.error();
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
    std::printf("  rank %u: %s%s%s\n", rj["rank"].get<uint32_t>(),
                rj["state"].get<std::string>().c_str(),
                rj.contains("shard_path") ? ", on disk" : "",
                rj.contains("slot_path") ? ", in memory" : "");
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
  std::printf("  items and their sharding:\n");
  for (const auto& [name, parts] : boxes) {
    std::printf("    %-36s %-28s %s\n", name.c_str(), kinds[name].c_str(),
                absl::StrJoin(parts, " ").c_str());
  }
  return 0;
}

// `ckpt verify JOB [STEP]`: every copy of every shard, on every tier.
int VerifyJob(const std::string& data_dir, const std::string& job,
              const std::string& step_text, bool json) {
  absl::optional<uint64_t> step;
  if (!step_text.empty()) {
    auto parsed = ParseStep(step_text);
    if (!parsed.ok()) return UsageError("verify", parsed.status());
    step = *parsed;
  }
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("verify", view.status());
  auto shards =
      step.has_value() ? (*view)->StepShards(job, *step) : (*view)->Shards(job);
  // The replicas this node holds for its peers, and the shared tier: a node
  // may hold copies of a job none of whose ranks ran here.
  const std::vector<ckpt::tools::TierCheck> beyond =
      (*view)->VerifyBeyond(job, step);
  if (!shards.ok() && (!absl::IsNotFound(shards.status()) || beyond.empty())) {
    return Fail("verify", shards.status());
  }
  if (!shards.ok()) shards = std::vector<proto::ShardRecord>();
  int problems = 0, copies = 0;
  uint64_t chunks = 0;
  nlohmann::json out = nlohmann::json::array();
  Progress progress("verify");
  int done = 0;
  auto record = [&](const ckpt::tools::TierCheck& c) {
    ++copies;
    chunks += c.chunks;
    problems += static_cast<int>(c.problems.size());
    nlohmann::json cj;
    cj["tier"] = c.tier;
    cj["step"] = c.step;
    cj["rank"] = c.rank;
    cj["path"] = c.path;
    cj["chunks"] = c.chunks;
    cj["problems"] = c.problems;
    out.push_back(std::move(cj));
    if (!json) {
      for (const std::string& p : c.problems) {
        std::printf("BAD %s step %lu rank %u: %s\n", c.tier.c_str(),
                    static_cast<unsigned long>(c.step), c.rank, p.c_str());
      }
    }
  };
  for (const proto::ShardRecord& r : *shards) {
    for (const ckpt::tools::TierCheck& c : (*view)->Verify(r)) {
      record(c);
    }
    progress.Update(++done, static_cast<int>(shards->size()));
  }
  for (const ckpt::tools::TierCheck& c : beyond) record(c);
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    if (step.has_value()) j["step"] = *step;
    j["ok"] = problems == 0;
    j["copies"] = out;
    std::cout << j.dump(2) << "\n";
  } else if (problems == 0) {
    std::printf("OK  job %s%s: %d shard copies, %lu chunks verified\n",
                job.c_str(),
                step.has_value() ? absl::StrCat(" step ", *step).c_str() : "",
                copies, static_cast<unsigned long>(chunks));
  } else {
    std::printf("%d problem(s) in job %s\n", problems, job.c_str());
  }
  return problems == 0 ? 0 : kExitProblems;
}

int Export(const std::string& data_dir, const std::string& job,
           const std::string& step_text, const std::string& format,
           const std::string& out, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("export", step.status());
  if (format != "safetensors") {
    std::cerr << "ckpt export: unknown format \"" << format
              << "\" (supported: safetensors)\n";
    return kExitUsage;
  }
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("export", view.status());
  Progress progress("export");
  auto stats = ckpt::tools::ExportSafetensors(
      **view, job, *step, out,
      [&](int done, int total) { progress.Update(done, total); });
  if (!stats.ok()) return Fail("export", stats.status());
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["step"] = *step;
    j["path"] = out;
    j["tensors"] = stats->tensors;
    j["bytes"] = stats->bytes;
    std::cout << j.dump(2) << "\n";
  } else {
    std::printf("exported job %s step %lu: %d tensors, %s -> %s\n", job.c_str(),
                static_cast<unsigned long>(*step), stats->tensors,
                HumanBytes(stats->bytes).c_str(), out.c_str());
  }
  return 0;
}

// True when something accepts connections on the unix socket.
bool Accepting(const std::string& socket_path) {
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  bool ok =
      ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  ::close(fd);
  return ok;
}

// The figures of ckptd's metrics for one job (what /metrics exports), as
// JSON: saves and their stall, persist throughput, compression, commit
// latency, work at risk, failures and recoveries, the checkpoint interval in
// use and the one Young/Daly suggests, restores.
nlohmann::json JobFigures(const std::vector<ckpt::tools::Sample>& m,
                          const std::string& job) {
  using ckpt::tools::SumOf;
  const std::map<std::string, std::string> j = {{"job", job}};
  auto get = [&](const std::string& name,
                 std::map<std::string, std::string> labels = {}) {
    labels.insert(j.begin(), j.end());
    return SumOf(m, name, labels);
  };
  auto mean = [&](const std::string& histogram,
                  std::map<std::string, std::string> labels = {})
      -> std::optional<double> {
    auto sum = get(histogram + "_sum", labels);
    auto count = get(histogram + "_count", labels);
    if (!sum || !count || *count == 0) return std::nullopt;
    return *sum / *count;
  };
  nlohmann::json f;
  auto put = [&f](const std::string& key, std::optional<double> v) {
    if (v.has_value()) f[key] = *v;
  };
  put("saves", get("ckpt_staging_seconds_count"));
  put("stall_mean_s", mean("ckpt_staging_seconds"));
  put("saves_skipped", get("ckpt_steps_skipped_total"));
  put("persist_failures", get("ckpt_persist_failures_total"));
  auto persisted = get("ckpt_persisted_bytes_total");
  auto persist_s = get("ckpt_persist_seconds_sum");
  if (persisted && persist_s && *persist_s > 0) {
    f["persist_bytes_per_s"] = *persisted / *persist_s;
  }
  put("compression_ratio", get("ckpt_compression_ratio"));
  put("replicated_bytes", get("ckpt_replicated_bytes_total"));
  put("replication_failures", get("ckpt_replication_failures_total"));
  put("fetched_from_peers_bytes", get("ckpt_peer_fetched_bytes_total"));
  put("shared_bytes", get("ckpt_shared_bytes_total"));
  for (const char* tier : {"memory", "peer", "local_disk", "shared"}) {
    put(absl::StrCat("commit_latency_mean_s_", tier),
        mean("ckpt_commit_latency_seconds", {{"tier", tier}}));
    put(absl::StrCat("last_commit_age_s_", tier),
        get("ckpt_last_commit_age_seconds", {{"tier", tier}}));
    put(absl::StrCat("last_committed_step_", tier),
        get("ckpt_last_committed_step", {{"tier", tier}}));
    put(absl::StrCat("restores_from_", tier),
        get("ckpt_restores_total", {{"source", tier}}));
  }
  for (const char* kind : {"job_restart", "daemon_restart"}) {
    put(absl::StrCat("failures_", kind),
        get("ckpt_failures_detected_total", {{"kind", kind}}));
  }
  put("recoveries", get("ckpt_recoveries_total"));
  put("recovery_mean_s", mean("ckpt_recovery_seconds"));
  put("checksum_mismatches", get("ckpt_checksum_mismatches_total"));
  put("trainers_attached", get("ckpt_trainers_attached"));
  for (const char* reason :
       {"idle_job", "older_step", "newest_step", "idle_ttl", "operator"}) {
    put(absl::StrCat("memory_evictions_", reason),
        get("ckpt_memory_evictions_total", {{"reason", reason}}));
  }
  put("restore_fallbacks", get("ckpt_restore_fallbacks_total"));
  put("save_interval_s", get("ckpt_save_interval_seconds"));
  put("save_cost_s", get("ckpt_save_cost_seconds"));
  put("mtbf_s", get("ckpt_mtbf_seconds"));
  put("young_daly_interval_s", get("ckpt_young_daly_interval_seconds"));
  return f;
}

std::string HumanSeconds(double s) {
  if (s < 1) return absl::StrCat(static_cast<int>(s * 1000 + 0.5), " ms");
  if (s < 120) return absl::StrFormat("%.1f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  return absl::StrFormat("%.1f h", s / 3600);
}

// `ckpt status`: is ckptd up, what the tiers hold, saves in flight, the last
// commit of every job.
int Status(const std::string& data_dir, const std::string& socket_path,
           bool json) {
  nlohmann::json j;
  j["data_dir"] = data_dir;
  j["socket"] = socket_path;
  j["daemon_accepting"] = Accepting(socket_path);
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("status", view.status());
  auto jobs = (*view)->Jobs();
  if (!jobs.ok()) return Fail("status", jobs.status());
  ckpt::io::FileSystem* fs = ckpt::io::DefaultFileSystem();
  uint64_t memory = 0, disk = 0;
  int staging = 0, staged = 0, failed = 0;
  j["jobs"] = nlohmann::json::array();
  for (const proto::JobRecord& job : *jobs) {
    auto shards = (*view)->Shards(job.job());
    auto commits = (*view)->Commits(job.job());
    if (!shards.ok()) return Fail("status", shards.status());
    if (!commits.ok()) return Fail("status", commits.status());
    for (const proto::ShardRecord& r : *shards) {
      if (!r.slot_path().empty()) memory += r.slot_bytes();
      if (!r.shard_path().empty()) {
        auto size = fs->FileSize(r.shard_path());
        if (size.ok()) disk += *size;
      }
      staging += r.state() == proto::SHARD_STAGING;
      staged += r.state() == proto::SHARD_STAGED;
      failed += r.state() == proto::SHARD_FAILED;
    }
    nlohmann::json jj;
    jj["job"] = job.job();
    jj["world_size"] = job.world_size();
    for (const proto::CommitRecord& c : *commits) {  // by step: last wins
      nlohmann::json cj;
      cj["step"] = c.step();
      cj["committed_unix_micros"] = c.committed_unix_micros();
      jj["latest"][ckpt::daemon::TierName(c.tier())] = cj;
    }
    j["jobs"].push_back(std::move(jj));
  }
  j["memory_tier_bytes"] = memory;
  j["disk_tier_bytes"] = disk;
  auto free_space = fs->FreeSpace(data_dir);
  if (free_space.ok()) j["disk_free_bytes"] = *free_space;
  // The running daemon's figures, from its metrics.
  std::vector<ckpt::tools::Sample> metrics;
  if (j["daemon_accepting"].get<bool>()) {
    auto text = ckpt::client::GetMetricsText(socket_path);
    if (text.ok()) metrics = ckpt::tools::ParseMetricsText(*text);
  }
  if (!metrics.empty()) {
    for (nlohmann::json& jj : j["jobs"]) {
      jj["figures"] = JobFigures(metrics, jj["job"].get<std::string>());
    }
    auto put = [&](const char* key, const char* name) {
      auto v = ckpt::tools::SumOf(metrics, name, {});
      if (v.has_value()) j[key] = *v;
    };
    put("memory_budget_bytes", "ckpt_memory_budget_bytes");
    put("disk_budget_bytes", "ckpt_disk_budget_bytes");
  }
  j["shards_being_staged"] = staging;
  j["shards_waiting_to_persist"] = staged;
  j["shards_failed"] = failed;
  if (json) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  std::printf("ckptd      %s (%s)\n",
              j["daemon_accepting"].get<bool>() ? "up" : "NOT RUNNING",
              socket_path.c_str());
  std::printf("data       %s\n", data_dir.c_str());
  std::printf(
      "memory     %s in staging slots%s\n", HumanBytes(memory).c_str(),
      j.contains("memory_budget_bytes")
          ? absl::StrCat(" of a ",
                         HumanBytes(j["memory_budget_bytes"].get<double>()),
                         " budget")
                .c_str()
          : "");
  std::printf("disk       %s in shard files, %s free\n",
              HumanBytes(disk).c_str(),
              free_space.ok() ? HumanBytes(*free_space).c_str() : "?");
  std::printf("in flight  %d being staged, %d waiting to persist, %d failed\n",
              staging, staged, failed);
  for (const nlohmann::json& jj : j["jobs"]) {
    std::string latest;
    if (jj.contains("latest")) {
      for (auto& [tier, c] : jj["latest"].items()) {
        absl::StrAppend(&latest, latest.empty() ? "" : ", ", tier, " step ",
                        c["step"].get<uint64_t>(), " (",
                        Age(c["committed_unix_micros"].get<int64_t>()), ")");
      }
    }
    std::printf("job %-20s world %-5u last commit: %s\n",
                jj["job"].get<std::string>().c_str(),
                jj["world_size"].get<uint32_t>(),
                latest.empty() ? "none" : latest.c_str());
    if (!jj.contains("figures")) continue;
    const nlohmann::json& f = jj["figures"];
    auto num = [&f](const char* key) {
      return f.contains(key) ? f[key].get<double>() : 0.0;
    };
    auto secs = [&](const char* key) {
      return f.contains(key) ? HumanSeconds(f[key].get<double>())
                             : std::string("-");
    };
    std::printf(
        "  saves      %.0f (stall mean %s), %.0f skipped for memory, "
        "%.0f persist failures\n",
        num("saves"), secs("stall_mean_s").c_str(), num("saves_skipped"),
        num("persist_failures"));
    std::printf(
        "  persist    %s/s, compression %.2f stored/raw, commit "
        "latency memory %s, disk %s\n",
        HumanBytes(static_cast<uint64_t>(num("persist_bytes_per_s"))).c_str(),
        num("compression_ratio"), secs("commit_latency_mean_s_memory").c_str(),
        secs("commit_latency_mean_s_local_disk").c_str());
    if (f.contains("replicated_bytes") || f.contains("shared_bytes") ||
        f.contains("fetched_from_peers_bytes")) {
      std::printf(
          "  beyond     %s pushed to peers (%.0f failed pushes), %s fetched "
          "from peers, %s to the shared tier; commit latency peer %s, "
          "shared %s\n",
          HumanBytes(static_cast<uint64_t>(num("replicated_bytes"))).c_str(),
          num("replication_failures"),
          HumanBytes(static_cast<uint64_t>(num("fetched_from_peers_bytes")))
              .c_str(),
          HumanBytes(static_cast<uint64_t>(num("shared_bytes"))).c_str(),
          secs("commit_latency_mean_s_peer").c_str(),
          secs("commit_latency_mean_s_shared").c_str());
    }
    std::printf(
        "  at risk    %s since the last disk commit, %.0f step(s) "
        "newer in memory only\n",
        secs("last_commit_age_s_local_disk").c_str(),
        std::max(0.0, num("last_committed_step_memory") -
                          num("last_committed_step_local_disk")));
    std::printf(
        "  failures   %.0f job restart(s), %.0f daemon restart(s); "
        "%.0f recoveries, time to recover mean %s\n",
        num("failures_job_restart"), num("failures_daemon_restart"),
        num("recoveries"), secs("recovery_mean_s").c_str());
    std::printf(
        "  interval   %s in use; Young/Daly suggests %s (save cost "
        "%s, MTBF %s)\n",
        secs("save_interval_s").c_str(), secs("young_daly_interval_s").c_str(),
        secs("save_cost_s").c_str(), secs("mtbf_s").c_str());
    std::string evicted;
    for (const char* reason :
         {"idle_job", "older_step", "newest_step", "idle_ttl", "operator"}) {
      const double n = num(absl::StrCat("memory_evictions_", reason).c_str());
      if (n > 0)
        absl::StrAppend(&evicted, evicted.empty() ? "" : ", ", n, " ", reason);
    }
    std::printf(
        "  memory     %.0f trainer(s) attached; copies dropped "
        "while safe elsewhere: %s\n",
        num("trainers_attached"), evicted.empty() ? "none" : evicted.c_str());
    std::printf(
        "  restores   %.0f from memory, %.0f from disk; %.0f checksum "
        "mismatches, %.0f fallbacks\n",
        num("restores_from_memory"), num("restores_from_local_disk"),
        num("checksum_mismatches"), num("restore_fallbacks"));
  }
  return 0;
}

// `ckpt gc JOB --memory`: the job's memory-tier copies that are safe at a
// durable tier go now; the others are listed with why they stay.
int GcMemory(const std::string& socket_path, const std::string& job,
             bool dry_run, bool json) {
  if (!Accepting(socket_path)) {
    std::cerr << "ckpt gc: no ckptd accepts on " << socket_path
              << "; memory-tier copies belong to the running daemon\n";
    return kExitProblems;
  }
  proto::CollectGarbageRequest req;
  req.set_job(job);
  req.set_memory(true);
  req.set_dry_run(dry_run);
  auto resp = ckpt::client::CollectGarbage(socket_path, req);
  if (!resp.ok()) return Fail("gc", resp.status());
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["dry_run"] = dry_run;
    j["dropped"] = nlohmann::json::array();
    for (const proto::DroppedCopy& d : resp->dropped()) {
      j["dropped"].push_back({{"step", d.step()},
                              {"rank", d.rank()},
                              {"slot_path", d.slot_path()}});
    }
    j["kept"] = nlohmann::json::array();
    for (const proto::KeptCopy& k : resp->kept()) {
      j["kept"].push_back(
          {{"step", k.step()}, {"rank", k.rank()}, {"reason", k.reason()}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const char* verb = dry_run ? "would drop" : "dropped";
  for (const proto::DroppedCopy& d : resp->dropped()) {
    std::printf("%s step %lu rank %u: memory\n", verb,
                static_cast<unsigned long>(d.step()), d.rank());
  }
  for (const proto::KeptCopy& k : resp->kept()) {
    std::printf("kept step %lu rank %u in memory: %s\n",
                static_cast<unsigned long>(k.step()), k.rank(),
                k.reason().c_str());
  }
  std::printf("job %s: %s %d memory-tier cop%s, kept %d\n", job.c_str(), verb,
              resp->dropped_size(), resp->dropped_size() == 1 ? "y" : "ies",
              resp->kept_size());
  return 0;
}

// `ckpt gc JOB --keep N`: retention through the daemon that owns the catalog,
// with its rules (daemon/retention.h). --dry-run works without a daemon: the
// same planner over the catalog read-only.
int Gc(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, int keep, int keep_memory, bool dry_run,
       bool json) {
  if (keep < 1 || keep_memory < 0) {
    std::cerr << "ckpt gc: --keep must be at least 1 (the latest committed "
                 "step is never deleted)\n";
    return kExitUsage;
  }
  proto::CollectGarbageResponse dropped;
  const bool daemon_up = Accepting(socket_path);
  if (daemon_up) {
    proto::CollectGarbageRequest req;
    req.set_job(job);
    req.set_keep_disk(keep);
    req.set_keep_memory(keep_memory);
    req.set_dry_run(dry_run);
    auto resp = ckpt::client::CollectGarbage(socket_path, req);
    if (!resp.ok()) return Fail("gc", resp.status());
    dropped = *std::move(resp);
  } else if (dry_run) {
    auto view = ckpt::tools::DataDirView::Open(data_dir);
    if (!view.ok()) return Fail("gc", view.status());
    auto shards = (*view)->Shards(job);
    auto commits = (*view)->Commits(job);
    if (!shards.ok()) return Fail("gc", shards.status());
    if (!commits.ok()) return Fail("gc", commits.status());
    ckpt::daemon::RetentionPlan plan = ckpt::daemon::PlanRetention(
        *commits, *shards, {keep, keep_memory == 0 ? 1 : keep_memory});
    for (const ckpt::daemon::RetentionAction& a : plan.actions) {
      *dropped.add_dropped() = ckpt::daemon::ToProto(a);
    }
  } else {
    std::cerr << "ckpt gc: no ckptd accepts on " << socket_path
              << "; the daemon owns the catalog, so start it (or pass "
                 "--socket), or use --dry-run to see what would go\n";
    return kExitProblems;
  }
  if (json) {
    nlohmann::json j;
    j["job"] = job;
    j["dry_run"] = dry_run;
    j["dropped"] = nlohmann::json::array();
    for (const proto::DroppedCopy& d : dropped.dropped()) {
      j["dropped"].push_back({{"step", d.step()},
                              {"rank", d.rank()},
                              {"shard_path", d.shard_path()},
                              {"slot_path", d.slot_path()},
                              {"forgotten", d.forgotten()}});
    }
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const char* verb = dry_run ? "would drop" : "dropped";
  for (const proto::DroppedCopy& d : dropped.dropped()) {
    std::printf("%s step %lu rank %u:%s%s%s\n", verb,
                static_cast<unsigned long>(d.step()), d.rank(),
                d.shard_path().empty() ? "" : " disk",
                d.slot_path().empty() ? "" : " memory",
                d.forgotten() ? " (nothing left of it)" : "");
  }
  std::printf(
      "job %s: %s %d shard cop%s%s\n", job.c_str(), verb,
      dropped.dropped_size(), dropped.dropped_size() == 1 ? "y" : "ies",
      !daemon_up ? " (planned from the catalog; ckptd is not running)" : "");
  return 0;
}

// `ckpt restore-plan JOB STEP --world M`: which saved shard and tier each
// piece of a restore onto M ranks would come from, each tensor split along
// --split-dim into M near-equal boxes (rank r gets [e*r/M, e*(r+1)/M)), as
// libckpt's Restore reads them: the memory-tier slot when it is there, else
// the shard file.
int RestorePlan(const std::string& data_dir, const std::string& socket_path,
                const std::string& job, const std::string& step_text,
                uint32_t world, int split_dim, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("restore-plan", step.status());
  if (world == 0) {
    std::cerr << "ckpt restore-plan: --world must be at least 1\n";
    return kExitUsage;
  }
  auto view = ckpt::tools::DataDirView::Open(data_dir);
  if (!view.ok()) return Fail("restore-plan", view.status());
  auto shards = (*view)->StepShards(job, *step);
  // A node of a cluster knows its own shards; the daemon, when it runs, finds
  // the others' (peers, shared tier) and the step's world size.
  auto commits = DaemonCommits(socket_path, job);
  if (!commits.ok()) return Fail("restore-plan", commits.status());
  uint32_t saved_world = 0;
  if (commits->has_value()) {
    for (const proto::CommitRecord& c : **commits) {
      if (c.step() == *step) saved_world = c.world_size();
    }
  }
  if (!shards.ok() &&
      (!absl::IsNotFound(shards.status()) || saved_world == 0)) {
    return Fail("restore-plan", shards.status());
  }
  if (!shards.ok()) shards = std::vector<proto::ShardRecord>();
  ckpt::io::FileSystem* fs = ckpt::io::DefaultFileSystem();
  auto exists = [fs](const std::string& p) {
    auto e = fs->Exists(p);
    return !p.empty() && e.ok() && *e;
  };
  // Tensors by name: their global shape, dtype and the saved pieces.
  struct Saved {
    uint32_t rank;
    ckpt::snapshot::Box box;
    std::string source, path;
  };
  std::map<std::string, std::pair<proto::Item, std::vector<Saved>>> tensors;
  auto add_pieces = [&](uint32_t rank, const proto::Item& item,
                        const std::string& source, const std::string& path) {
    if (item.kind() != proto::ITEM_KIND_TENSOR) return;
    auto& t = tensors[item.name()];
    t.first = item;
    t.second.push_back({rank,
                        {{item.box_offset().begin(), item.box_offset().end()},
                         {item.box_length().begin(), item.box_length().end()}},
                        source,
                        path});
  };
  std::set<uint32_t> here;
  for (const proto::ShardRecord& r : *shards) {
    std::string source, path;
    if (r.state() == proto::SHARD_STAGING || r.state() == proto::SHARD_FAILED) {
      // not restorable
    } else if (exists(r.slot_path())) {
      source = "memory", path = r.slot_path();
    } else if (r.state() == proto::SHARD_PERSISTED && exists(r.shard_path())) {
      source = "local_disk", path = r.shard_path();
    }
    if (!source.empty()) here.insert(r.rank());
    if (saved_world == 0) saved_world = r.world_size();
    for (const proto::StagedItem& s : r.items()) {
      add_pieces(r.rank(), s.item(), source, path);
    }
  }
  // The saved ranks this node has no copy of: where the daemon would fetch
  // them from, without fetching.
  int unlocated = 0;
  for (uint32_t rank = 0; commits->has_value() && rank < saved_world; ++rank) {
    if (here.count(rank) > 0) continue;
    proto::FindShardRequest req;
    req.mutable_shard()->set_job(job);
    req.mutable_shard()->set_step(*step);
    req.mutable_shard()->set_rank(rank);
    auto found = ckpt::client::CallDaemon<proto::FindShardRequest,
                                          proto::FindShardResponse>(
        socket_path, &proto::CkptDaemon::Stub::FindShard, req,
        absl::StrCat("finding rank ", rank, "'s shard"),
        std::chrono::seconds(30));
    if (!found.ok()) {
      if (!absl::IsNotFound(found.status())) {
        return Fail("restore-plan", found.status());
      }
      ++unlocated;
      continue;
    }
    const proto::ShardSource& best = found->sources(0);
    std::string source;
    if (best.tier() == proto::TIER_PEER) {
      source = best.here() ? "replica_here" : "peer_memory";
    } else if (best.tier() == proto::TIER_LOCAL_DISK && !best.here()) {
      source = "peer_disk";
    }
    if (source.empty()) source = ckpt::daemon::TierName(best.tier());
    if (!best.node().empty() && !best.here()) {
      absl::StrAppend(&source, "@", best.node());
    }
    for (const proto::Item& item : found->items()) {
      add_pieces(rank, item, source, best.path());
    }
  }
  nlohmann::json out;
  out["job"] = job;
  out["step"] = *step;
  out["world"] = world;
  out["ranks"] = nlohmann::json::array();
  int missing = 0;
  for (uint32_t rank = 0; rank < world; ++rank) {
    nlohmann::json rj;
    rj["rank"] = rank;
    rj["tensors"] = nlohmann::json::array();
    for (const auto& [name, t] : tensors) {
      const proto::Item& item = t.first;
      std::vector<int64_t> shape(item.global_shape().begin(),
                                 item.global_shape().end());
      ckpt::snapshot::Box want{std::vector<int64_t>(shape.size(), 0), shape};
      if (!shape.empty()) {
        const size_t d = std::min<size_t>(split_dim, shape.size() - 1);
        want.offset[d] = shape[d] * rank / world;
        want.length[d] = shape[d] * (rank + 1) / world - want.offset[d];
      }
      nlohmann::json tj;
      tj["name"] = name;
      tj["box_offset"] = want.offset;
      tj["box_length"] = want.length;
      tj["pieces"] = nlohmann::json::array();
      int64_t covered = 0;
      for (const Saved& piece : t.second) {
        const int64_t n = ckpt::snapshot::Intersect(piece.box, want).elements();
        if (n == 0) continue;
        nlohmann::json pj;
        pj["saved_rank"] = piece.rank;
        pj["elements"] = n;
        pj["bytes"] = n * ckpt::snapshot::DTypeSize(item.dtype());
        pj["source"] = piece.source.empty() ? "none" : piece.source;
        if (!piece.path.empty()) pj["path"] = piece.path;
        if (!piece.source.empty()) covered += n;
        tj["pieces"].push_back(std::move(pj));
      }
      tj["missing_elements"] = want.elements() - covered;
      if (want.elements() != covered) ++missing;
      rj["tensors"].push_back(std::move(tj));
    }
    out["ranks"].push_back(std::move(rj));
  }
  out["complete"] = missing == 0;
  out["saved_world"] = saved_world;
  out["ranks_without_a_copy"] = unlocated;
  if (json) {
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "restore of job %s step %lu onto %u ranks (split along dim %d)\n",
        job.c_str(), static_cast<unsigned long>(*step), world, split_dim);
    for (const nlohmann::json& rj : out["ranks"]) {
      std::printf("  rank %u\n", rj["rank"].get<uint32_t>());
      for (const nlohmann::json& tj : rj["tensors"]) {
        std::string pieces;
        for (const nlohmann::json& pj : tj["pieces"]) {
          absl::StrAppend(&pieces, pieces.empty() ? "" : ", ", "r",
                          pj["saved_rank"].get<uint32_t>(), " ",
                          pj["source"].get<std::string>(), " ",
                          HumanBytes(pj["bytes"].get<uint64_t>()));
        }
        std::printf(
            "    %-32s %s+%s <- %s%s\n", tj["name"].get<std::string>().c_str(),
            tj["box_offset"].dump().c_str(), tj["box_length"].dump().c_str(),
            pieces.empty() ? "nothing" : pieces.c_str(),
            tj["missing_elements"].get<int64_t>() > 0
                ? absl::StrCat("  MISSING ",
                               tj["missing_elements"].get<int64_t>(),
                               " elements")
                      .c_str()
                : "");
      }
    }
    if (unlocated > 0)
      std::printf("%d of the %u saved ranks have no copy anywhere\n", unlocated,
                  saved_world);
    if (missing > 0)
      std::printf("%d tensor box(es) cannot be restored\n", missing);
  }
  return missing == 0 ? 0 : kExitProblems;
}

// A shard file argument rather than a job id: named like one, or an existing
// file.
bool IsShardFile(const std::string& arg) {
  if (absl::EndsWith(arg, ckpt::snapshot::kShardSuffix)) return true;
  absl::StatusOr<bool> exists = ckpt::io::DefaultFileSystem()->Exists(arg);
  return exists.ok() && *exists;
}

}  // namespace

// `ckpt restore JOB STEP [--into JOB2] [--discard-newer]`: verifies every
// copy of the step first, then has ckptd make it what the job (or the new job
// JOB2) resumes from.
int Restore(const std::string& data_dir, const std::string& socket_path,
            const std::string& job, const std::string& step_text,
            const std::string& into, bool discard_newer, bool json) {
  auto step = ParseStep(step_text);
  if (!step.ok()) return UsageError("restore", step.status());
  if (!into.empty() && discard_newer) {
    return UsageError("restore", absl::InvalidArgumentError(
                                     "--discard-newer is for an in-place "
                                     "restore, not for --into"));
  }
  {
    auto view = ckpt::tools::DataDirView::Open(data_dir);
    if (!view.ok()) return Fail("restore", view.status());
    auto shards = (*view)->StepShards(job, *step);
    if (!shards.ok()) return Fail("restore", shards.status());
    for (const proto::ShardRecord& r : *shards) {
      for (const ckpt::tools::TierCheck& c : (*view)->Verify(r)) {
        if (c.tier != "local_disk" || c.problems.empty()) continue;
        std::cerr << "ckpt restore: step " << *step << " rank " << c.rank
                  << " does not verify (" << c.path << ": "
                  << c.problems.front() << "); nothing was changed\n";
        return kExitProblems;
      }
    }
  }
  proto::RollBackRequest req;
  req.set_job(job);
  req.set_step(*step);
  req.set_into(into);
  req.set_discard_newer(discard_newer);
  auto resp = ckpt::client::RollBack(socket_path, req);
  if (!resp.ok()) return Fail("restore", resp.status());
  const proto::RollbackRecord& r = resp->record();
  if (json) {
    nlohmann::json j;
    j["job"] = r.job();
    j["step"] = r.to_step();
    j["from_step"] = r.from_step();
    if (!r.forked_from().empty()) j["forked_from"] = r.forked_from();
    if (!r.archived_as().empty()) j["archived_as"] = r.archived_as();
    j["dropped_steps"] = r.dropped_steps();
    std::cout << j.dump(2) << "\n";
  } else if (!r.forked_from().empty()) {
    std::printf(
        "job %s forked from job %s at step %lu: it resumes from there\n",
        r.job().c_str(), r.forked_from().c_str(),
        static_cast<unsigned long>(r.to_step()));
  } else {
    std::printf("job %s resumes from step %lu (was %lu); %u newer step(s) %s\n",
                r.job().c_str(), static_cast<unsigned long>(r.to_step()),
                static_cast<unsigned long>(r.from_step()), r.dropped_steps(),
                r.archived_as().empty()
                    ? "discarded"
                    : ("kept as job " + r.archived_as()).c_str());
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "ckpt: list, inspect, verify and export the checkpoints of a ckptd data "
      "directory\n(exit codes: 0 good, 1 problems found or the operation "
      "failed, 2 bad usage, 3 not found)"};
  app.require_subcommand(1);
  bool json = false;
  const char* env_dir = std::getenv("CKPT_DATA_DIR");
  std::string data_dir = env_dir != nullptr
                             ? env_dir
                             : absl::StrCat("/tmp/ckpt-", ::getuid(), "/data");
  app.add_option("--data-dir", data_dir,
                 "ckptd's data directory (env CKPT_DATA_DIR)")
      ->capture_default_str();

  // Empty: the socket the data directory's ckptd recorded, else the default.
  std::string socket_path;
  std::string ls_job;
  CLI::App* ls = app.add_subcommand(
      "ls", "jobs, or the steps of JOB with their state per tier and sizes");
  ls->add_option("job", ls_job, "job id");
  ls->add_option("--socket", socket_path,
                 "ckptd's socket (default: the one the data directory's ckptd "
                 "recorded): commit records come from its coordinator (etcd's "
                 "on a cluster) while it runs, else from the data directory");
  ls->add_flag("--json", json, "print JSON");

  std::vector<std::string> inspect_args;
  CLI::App* inspect = app.add_subcommand(
      "inspect",
      "JOB STEP: tensors, dtypes, shapes, how they are sharded, chunks and "
      "codecs; or PATH.shard: one shard file");
  inspect->add_option("target", inspect_args, "JOB STEP, or PATH.shard")
      ->required()
      ->expected(1, 2);
  inspect->add_flag("--json", json, "print one JSON object");

  std::vector<std::string> verify_args;
  CLI::App* verify = app.add_subcommand(
      "verify",
      "JOB [STEP]: check every chunk of every copy on every tier; or "
      "PATH.shard...: shard files. Exit 1 and a line per problem");
  verify->add_option("target", verify_args, "JOB [STEP], or shard files")
      ->required();
  verify->add_flag("--json", json, "print JSON");

  std::string export_job, export_step, format = "safetensors", export_out;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "JOB STEP OUT: assemble full tensors from the shards of a committed "
      "step and write them in a format the ecosystem reads");
  export_cmd->add_option("job", export_job, "job id")->required();
  export_cmd->add_option("step", export_step, "committed step")->required();
  export_cmd->add_option("out", export_out, "output file")->required();
  export_cmd->add_option("--format", format, "safetensors")
      ->capture_default_str();
  export_cmd->add_flag("--json", json, "print JSON");

  CLI::App* status = app.add_subcommand(
      "status",
      "ckptd up or not, memory and disk use, saves in flight, last commit "
      "per job");
  status->add_option("--socket", socket_path,
                     "ckptd's socket (default: the one the data directory's "
                     "ckptd recorded)");
  status->add_flag("--json", json, "print one JSON object");

  std::string gc_job;
  int keep = 0, keep_memory = 0;
  bool dry_run = false;
  CLI::App* gc = app.add_subcommand(
      "gc",
      "apply retention to JOB now with ckptd's rules: keep the newest N steps "
      "committed on disk (the latest and the one before are never dropped "
      "early)");
  gc->add_option("job", gc_job, "job id")->required();
  bool gc_memory = false;
  CLI::Option* keep_option =
      gc->add_option("--keep", keep, "committed steps kept on disk");
  gc->add_flag("--memory", gc_memory,
               "drop the job's memory-tier copies that are safe on disk or at "
               "peers instead (the only copy of a step, and copies being "
               "saved or read, stay)")
      ->excludes(keep_option);
  gc->add_option("--keep-memory", keep_memory,
                 "committed steps kept in memory (default: ckptd's)");
  gc->add_flag("--dry-run", dry_run, "only say what would be dropped");
  gc->add_option("--socket", socket_path,
                 "ckptd's socket (default: the one the data directory's "
                 "ckptd recorded)");
  gc->add_flag("--json", json, "print JSON");

  std::string plan_job, plan_step;
  uint32_t plan_world = 0;
  int split_dim = 0;
  CLI::App* restore_plan = app.add_subcommand(
      "restore-plan",
      "JOB STEP --world M: a dry run of restoring STEP onto M ranks: which "
      "saved shard and tier each piece comes from");
  restore_plan->add_option("job", plan_job, "job id")->required();
  restore_plan->add_option("step", plan_step, "committed step")->required();
  restore_plan->add_option("--world", plan_world, "ranks to restore onto")
      ->required();
  restore_plan
      ->add_option("--split-dim", split_dim,
                   "dimension the tensors are split along")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  restore_plan->add_option("--socket", socket_path,
                           "ckptd's socket (default: the one the data "
                           "directory's ckptd recorded): it finds the saved "
                           "ranks this node has no copy of");
  restore_plan->add_flag("--json", json, "print JSON");

  std::string restore_job, restore_step, into;
  bool discard_newer = false;
  CLI::App* restore = app.add_subcommand(
      "restore",
      "JOB STEP: after verifying it, make committed STEP what the job resumes "
      "from (the operator's rollback); newer steps are kept as an archive job "
      "unless --discard-newer; --into JOB2 forks a new job instead");
  restore->add_option("job", restore_job, "job id")->required();
  restore->add_option("step", restore_step, "committed step")->required();
  restore->add_option("--into", into, "a new job that resumes from STEP");
  restore->add_flag("--discard-newer", discard_newer,
                    "drop the steps newer than STEP instead of archiving them");
  restore->add_option("--socket", socket_path,
                      "ckptd's socket (default: the one the data directory's "
                      "ckptd recorded)");
  restore->add_flag("--json", json, "print JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  if (socket_path.empty()) socket_path = DaemonSocketOf(data_dir);
  if (*ls) return Ls(data_dir, socket_path, ls_job, json);
  if (*restore) {
    return Restore(data_dir, socket_path, restore_job, restore_step, into,
                   discard_newer, json);
  }
  if (*status) return Status(data_dir, socket_path, json);
  if (*restore_plan) {
    return RestorePlan(data_dir, socket_path, plan_job, plan_step, plan_world,
                       split_dim, json);
  }
  if (*gc && gc_memory) return GcMemory(socket_path, gc_job, dry_run, json);
  if (*gc && keep_option->count() == 0) {
    std::cerr << "ckpt gc: give --keep N (retention) or --memory\n";
    return kExitUsage;
  }
  if (*gc) {
    return Gc(data_dir, socket_path, gc_job, keep, keep_memory, dry_run, json);
  }
  if (*inspect) {
    if (inspect_args.size() == 1) {
      if (!IsShardFile(inspect_args[0])) {
        std::cerr << "ckpt inspect: " << inspect_args[0]
                  << " is no file; give JOB STEP, or a shard file\n";
        return kExitUsage;
      }
      return Inspect(inspect_args[0], json);
    }
    return InspectStep(data_dir, inspect_args[0], inspect_args[1], json);
  }
  if (*verify) {
    if (IsShardFile(verify_args[0])) return Verify(verify_args, json);
    if (verify_args.size() > 2) {
      std::cerr << "ckpt verify: give JOB [STEP], or shard files\n";
      return kExitUsage;
    }
    return VerifyJob(data_dir, verify_args[0],
                     verify_args.size() == 2 ? verify_args[1] : "", json);
  }
  if (*export_cmd) {
    return Export(data_dir, export_job, export_step, format, export_out, json);
  }
  return kExitUsage;
}
