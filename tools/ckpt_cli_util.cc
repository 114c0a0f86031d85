// ckpt: helpers the subcommands share (see tools/ckpt_cli.h).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/daemon_admin.h"
#include "daemon/api/data_dir_reader.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "tools/ckpt_cli.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

std::string CodecName(proto::Codec c) {
  switch (c) {
    case proto::CODEC_NONE:
      return "none";
    case proto::CODEC_ZSTD:
      return "zstd";
    case proto::CODEC_ZSTD_PLANES:
      return "zstd-planes";
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
  uint64_t stored = 0, in_bases = 0;
  int chunks_in_bases = 0, xor_deltas = 0;
  uint32_t xor_depth = 0;
  std::map<std::string, int> codecs;
  for (const proto::ChunkInfo& c : item.chunks()) {
    if (c.xor_base() != 0) {  // the XOR with an earlier save's chunk
      ++xor_deltas;
      xor_depth = std::max(xor_depth, c.xor_depth());
    }
    if (c.base() != 0) {  // unchanged since a base shard, stored there
      in_bases += c.stored_size();
      ++chunks_in_bases;
      continue;
    }
    stored += c.stored_size();
    std::string key = CodecName(c.codec());
    if (c.filter() == proto::FILTER_BYTE_SHUFFLE) key += "+shuffle";
    ++codecs[key];
  }
  j["raw_size"] = item.raw_size();
  j["stored_size"] = stored;
  j["chunks"] = item.chunks_size();
  j["codecs"] = codecs;
  j["chunks_in_bases"] = chunks_in_bases;
  j["stored_in_bases"] = in_bases;
  j["xor_delta_chunks"] = xor_deltas;
  j["xor_max_depth"] = xor_depth;
  return j;
}

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
  for (proto::Tier t : s.committed)
    tiers.push_back(ckpt::daemon::api::TierName(t));
  j["committed"] = tiers;
  j["raw_bytes"] = s.raw_bytes;
  j["stored_bytes"] = s.stored_bytes;
  j["newest_unix_micros"] = s.newest_unix_micros;
  return j;
}

std::string TierCell(const ckpt::tools::StepSummary& s, proto::Tier tier,
                     uint32_t ranks) {
  for (proto::Tier t : s.committed) {
    if (t == tier) return "committed";
  }
  if (ranks == 0) return "-";
  return absl::StrCat(ranks, "/", s.world_size);
}

std::string DaemonSocketOf(const std::string& data_dir) {
  absl::optional<ckpt::tools::DaemonRecord> d =
      ckpt::tools::ReadDaemonRecord(data_dir);
  if (d.has_value() && !d->socket.empty()) return d->socket;
  return absl::StrCat("/tmp/ckpt-", ::getuid(), "/ckptd.sock");
}

namespace {

// What the running ckptd lists of `job`; nullopt when none answers.
absl::StatusOr<std::optional<proto::ListCommitsResponse>> ListDaemonCommits(
    const std::string& socket_path, const std::string& job) {
  proto::ListCommitsRequest req;
  req.set_job(job);
  auto resp = ckpt::client::CallDaemon<proto::ListCommitsRequest,
                                       proto::ListCommitsResponse>(
      socket_path, &proto::CkptDaemon::Stub::ListCommits, req,
      "listing the commits of job " + job, std::chrono::seconds(10));
  if (absl::IsUnavailable(resp.status())) return std::nullopt;
  if (!resp.ok()) return resp.status();
  return *std::move(resp);
}

}  // namespace

absl::StatusOr<std::optional<std::vector<proto::CommitRecord>>> DaemonCommits(
    const std::string& socket_path, const std::string& job) {
  auto resp = ListDaemonCommits(socket_path, job);
  if (!resp.ok()) return resp.status();
  if (!resp->has_value()) return std::nullopt;
  return std::vector<proto::CommitRecord>((*resp)->commits().begin(),
                                          (*resp)->commits().end());
}

absl::StatusOr<std::vector<proto::ReplicaCheck>> DaemonSuspects(
    const std::string& socket_path, const std::string& job) {
  auto resp = ListDaemonCommits(socket_path, job);
  if (!resp.ok()) return resp.status();
  if (!resp->has_value()) return std::vector<proto::ReplicaCheck>();
  return std::vector<proto::ReplicaCheck>((*resp)->suspects().begin(),
                                          (*resp)->suspects().end());
}

absl::StatusOr<std::vector<proto::FailureRecord>> DaemonFailures(
    const std::string& socket_path, const std::string& job) {
  proto::ListFailuresRequest req;
  req.set_job(job);
  auto resp = ckpt::client::CallDaemon<proto::ListFailuresRequest,
                                       proto::ListFailuresResponse>(
      socket_path, &proto::CkptDaemon::Stub::ListFailures, req,
      "listing the failures of job " + job, std::chrono::seconds(10));
  if (absl::IsUnavailable(resp.status()))
    return std::vector<proto::FailureRecord>();
  if (!resp.ok()) return resp.status();
  return std::vector<proto::FailureRecord>(resp->failures().begin(),
                                           resp->failures().end());
}

nlohmann::json SuspectJson(const proto::ReplicaCheck& check) {
  nlohmann::json j;
  j["step"] = check.step();
  j["replicated_boxes"] = check.replicated_boxes();
  j["checked_by"] = check.checked_by();
  j["mismatches"] = nlohmann::json::array();
  for (const proto::ReplicaMismatch& m : check.mismatches()) {
    nlohmann::json mj;
    mj["item"] = m.item();
    mj["majority_ranks"] = std::vector<uint32_t>(m.majority_ranks().begin(),
                                                 m.majority_ranks().end());
    mj["minority_ranks"] = std::vector<uint32_t>(m.minority_ranks().begin(),
                                                 m.minority_ranks().end());
    mj["minority_nodes"] = std::vector<std::string>(m.minority_nodes().begin(),
                                                    m.minority_nodes().end());
    j["mismatches"].push_back(std::move(mj));
  }
  return j;
}

std::string SuspectLine(const proto::ReplicaCheck& check) {
  std::vector<std::string> parts;
  for (const proto::ReplicaMismatch& m : check.mismatches()) {
    std::vector<std::string> odd;
    for (int i = 0; i < m.minority_ranks_size(); ++i) {
      odd.push_back(absl::StrCat("rank ", m.minority_ranks(i), " (node ",
                                 m.minority_nodes(i), ")"));
    }
    parts.push_back(absl::StrCat(
        "\"", m.item(), "\" on ", absl::StrJoin(odd, ", "),
        m.majority_ranks().empty()
            ? " disagree, no majority"
            : absl::StrCat(" outside the majority (ranks ",
                           absl::StrJoin(m.majority_ranks(), ", "), ")")));
  }
  return absl::StrCat("step ", check.step(),
                      " SUSPECT (replicas disagree, not resumed from): ",
                      absl::StrJoin(parts, "; "));
}

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

std::string HumanSeconds(double s) {
  if (s < 1) return absl::StrCat(static_cast<int>(s * 1000 + 0.5), " ms");
  if (s < 120) return absl::StrFormat("%.1f s", s);
  if (s < 7200) return absl::StrFormat("%.1f min", s / 60);
  return absl::StrFormat("%.1f h", s / 3600);
}

bool IsStoreLocation(const std::string& arg) {
  if (absl::StartsWith(arg, "s3://")) return true;
  std::error_code ec;
  return arg.find('/') != std::string::npos &&
         std::filesystem::is_directory(arg, ec);
}

bool IsShardFile(const std::string& arg) {
  if (absl::EndsWith(arg, ckpt::snapshot::kShardSuffix)) return true;
  absl::StatusOr<bool> exists = ckpt::io::DefaultFileSystem()->Exists(arg);
  return exists.ok() && *exists;
}

}  // namespace ckpt::cli
