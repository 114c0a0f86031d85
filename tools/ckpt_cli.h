// ckpt, the operators' command: what its subcommands share. Each subcommand
// lives in its own file (ckpt_ls.cc, ckpt_inspect.cc, ckpt_verify.cc,
// ckpt_export.cc, ckpt_status.cc, ckpt_gc.cc, ckpt_restore.cc), the helpers in
// ckpt_cli_util.cc, the command line in ckpt_main.cc. Each function runs one
// subcommand on the calling thread and returns the process's exit code:
// 0 good, 1 a check found problems or an operation failed, 2 bad usage, 3 what
// was asked for does not exist (data directory, job, step).
#ifndef CKPT_TOOLS_CKPT_CLI_H_
#define CKPT_TOOLS_CKPT_CLI_H_

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "proto/catalog.pb.h"
#include "proto/daemon.pb.h"
#include "snapshot/shard_reader.h"
#include "tools/data_dir_view.h"

namespace ckpt::cli {

using ckpt::snapshot::ShardReader;
namespace proto = ckpt::proto;

inline constexpr int kExitProblems = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitNotFound = 3;

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

// The tiers `ckpt ls` shows, in the order data moves through them.
inline constexpr proto::Tier kLsTiers[] = {proto::TIER_MEMORY, proto::TIER_PEER,
                                           proto::TIER_LOCAL_DISK,
                                           proto::TIER_SHARED};

// --- helpers (ckpt_cli_util.cc) ---

std::string CodecName(proto::Codec c);

std::string Dims(const google::protobuf::RepeatedField<int64_t>& dims);

nlohmann::json ItemJson(const proto::Item& item);

int Fail(absl::string_view command, const absl::Status& s);

int UsageError(absl::string_view command, const absl::Status& s);

std::string HumanBytes(uint64_t n);

std::string Age(int64_t unix_micros);

absl::StatusOr<uint64_t> ParseStep(const std::string& text);

nlohmann::json StepJson(const ckpt::tools::StepSummary& s);

// Per tier: "committed", "k/N" ranks of this node there, or "-".
std::string TierCell(const ckpt::tools::StepSummary& s, proto::Tier tier,
                     uint32_t ranks);

// Where the ckptd of `data_dir` listens: what it recorded there when it
// started, else ckptd's default socket.
std::string DaemonSocketOf(const std::string& data_dir);

// The commit records of `job` as the running ckptd's coordinator has them
// (etcd's for a node of a cluster: commits other nodes' votes made
// included); nullopt when no ckptd answers at `socket_path`.
absl::StatusOr<std::optional<std::vector<proto::CommitRecord>>> DaemonCommits(
    const std::string& socket_path, const std::string& job);

// The steps of `job` the running ckptd found suspect (their replicas
// disagree: silent data corruption, daemon/health/replica_check.h); empty
// when no ckptd answers at `socket_path`.
absl::StatusOr<std::vector<proto::ReplicaCheck>> DaemonSuspects(
    const std::string& socket_path, const std::string& job);
// A suspect step as JSON ({step, replicated_boxes, checked_by, mismatches:
// [{item, majority_ranks, minority_ranks, minority_nodes}]}), and as one
// line naming the ranks and nodes outside each box's majority.
nlohmann::json SuspectJson(const proto::ReplicaCheck& check);
std::string SuspectLine(const proto::ReplicaCheck& check);

// The failures the running ckptd saw of `job`, oldest first (empty when no
// ckptd answers).
absl::StatusOr<std::vector<proto::FailureRecord>> DaemonFailures(
    const std::string& socket_path, const std::string& job);

// True when something accepts connections on the unix socket.
bool Accepting(const std::string& socket_path);

std::string HumanSeconds(double s);

// A shard file argument rather than a job id: named like one, or an existing
// file.
bool IsShardFile(const std::string& arg);

// --- the subcommands ---

// A shard file (through `fs`, the local file system unless given).
int Inspect(const std::string& path, bool json, io::FileSystem* fs = nullptr);

// `ckpt inspect JOB STEP`: the step's tensors with how they are sharded.
int InspectStep(const std::string& data_dir, const std::string& socket_path,
                const std::string& job, const std::string& step_text,
                bool json);

// Shard files (through `fs`, the local file system unless given).
int Verify(const std::vector<std::string>& paths, bool json,
           io::FileSystem* fs = nullptr);
// Whether a command's argument names the shared tier read directly: an
// s3:// URI, or the path of a directory (job ids have no '/').
bool IsStoreLocation(const std::string& arg);

// `ckpt verify JOB [STEP]`: every copy of every shard, on every tier.
int VerifyJob(const std::string& data_dir, const std::string& job,
              const std::string& step_text, bool json);

int Ls(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, bool json);

// False, with the error printed, for a format `ckpt export` does not write.
bool KnownExportFormat(const std::string& format);

int Export(const std::string& data_dir, const std::string& job,
           const std::string& step_text, const std::string& format,
           const std::string& out, bool json);

// `ckpt status`: is ckptd up, what the tiers hold, saves in flight, the last
// commit of every job.
int Status(const std::string& data_dir, const std::string& socket_path,
           bool json);

// `ckpt gc JOB --memory`: the job's memory-tier copies that are safe at a
// durable tier go now; the others are listed with why they stay.
int GcMemory(const std::string& socket_path, const std::string& job,
             bool dry_run, bool json);

// `ckpt gc JOB --keep N`: retention through the daemon that owns the catalog,
// with its rules (daemon/persist/retention.h). --dry-run works without a
// daemon: the same planner over the catalog read-only.
int Gc(const std::string& data_dir, const std::string& socket_path,
       const std::string& job, int keep, int keep_memory, bool dry_run,
       bool json);

// `ckpt restore-plan JOB STEP --world M`: which saved shard and tier each
// piece of a restore onto M ranks would come from, each tensor split along
// --split-dim into M near-equal boxes (rank r gets [e*r/M, e*(r+1)/M)), as
// libckpt's Restore reads them: the memory-tier slot when it is there, else
// the shard file.
int RestorePlan(const std::string& data_dir, const std::string& socket_path,
                const std::string& job, const std::string& step_text,
                uint32_t world, int split_dim, bool json);

// `ckpt restore JOB STEP [--into JOB2] [--discard-newer]`: verifies every
// copy of the step first, then has ckptd make it what the job (or the new job
// JOB2) resumes from.
int Restore(const std::string& data_dir, const std::string& socket_path,
            const std::string& job, const std::string& step_text,
            const std::string& into, bool discard_newer, bool json);

// The command line.
// ckpt publish JOB STEP --topic T [--items GLOB]... [--cast bf16]
// (ckpt_publish.cc).
int Publish(const std::string& socket_path, const std::string& job,
            const std::string& step, const std::string& topic,
            const std::vector<std::string>& items, const std::string& cast,
            bool json);
// ckpt topics: the topics, their newest versions, what this node holds,
// the subscribers.
int Topics(const std::string& socket_path, bool json);
// ckpt subscribe TOPIC: the node's ckptd fetches each new version of TOPIC
// from its peers from now on.
int Subscribe(const std::string& socket_path, const std::string& topic,
              bool json);

int Main(int argc, char** argv);

}  // namespace ckpt::cli

#endif  // CKPT_TOOLS_CKPT_CLI_H_
