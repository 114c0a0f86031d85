// ckpt: the operators' command. It reads a ckptd data directory directly (the
// catalog opened read-only, which works whether or not ckptd runs): `ls`,
// `inspect`, `verify` and `export`; `inspect` and `verify` also take shard
// files. Exit codes: 0 good, 1 a check found problems or an operation failed,
// 2 bad usage, 3 what was asked for does not exist (data directory, job, step).
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>

#include "CLI/CLI.hpp"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "client/daemon_admin.h"
#include "daemon/api/data_dir_reader.h"
#include "nlohmann/json.hpp"
#include "snapshot/dtype.h"
#include "snapshot/manifest_seal.h"
#include "tools/ckpt_cli.h"
#include "tools/ckpt_store.h"
#include "tools/export.h"

namespace ckpt::cli {

int Main(int argc, char** argv) {
  CLI::App app{
      "ckpt: list, inspect, verify and export the checkpoints of a ckptd data "
      "directory\n(exit codes: 0 good, 1 problems found or the operation "
      "failed, 2 bad usage, 3 not found)"};
  app.require_subcommand(1);
  bool json = false;
  const char* env_dir = std::getenv("CKPT_DATA_DIR");
  std::string data_dir =
      env_dir != nullptr ? env_dir : daemon::api::DefaultDataDir();
  app.add_option("--data-dir", data_dir,
                 "ckptd's data directory (env CKPT_DATA_DIR); without it, the "
                 "one of the ckptd at --socket, else this default (a stopped "
                 "node)")
      ->capture_default_str();

  // Empty: the socket the data directory's ckptd recorded, else the default.
  std::string socket_path;
  app.add_option("--socket", socket_path,
                 "ckptd's socket (default: $CKPT_SOCKET, else "
                 "/tmp/ckpt-$UID/ckptd.sock): without --data-dir, ckpt asks "
                 "this daemon where its data is");
  StoreOptions store;
  app.add_option("--s3-endpoint", store.endpoint,
                 "for s3:// locations: the object store's endpoint "
                 "(default: AWS's for --s3-region)");
  app.add_option("--s3-region", store.region, "the object store's region")
      ->capture_default_str();
  app.add_option("--s3-path-style", store.path_style,
                 "path-style addressing (servers other than AWS's)")
      ->capture_default_str();
  app.add_option("--s3-profile", store.credentials.profile,
                 "the shared credentials file's profile");
  app.add_option("--s3-credentials-file", store.credentials.credentials_file,
                 "the shared credentials file (credentials come from "
                 "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY first)");
  std::string ls_job;
  CLI::App* ls = app.add_subcommand(
      "ls", "jobs, or the steps of JOB with their state per tier and sizes");
  ls->add_option("job", ls_job,
                 "job id; or the shared tier read directly: "
                 "s3://bucket/prefix[/JOB] or a shared directory's path");
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
  inspect
      ->add_option("target", inspect_args,
                   "JOB STEP, PATH.shard, or s3://BUCKET/.../STEP-RANK.ckpt")
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
  std::string cluster_key;
  std::vector<std::string> cluster_key_old;
  verify->add_option("--cluster-key", cluster_key,
                     "also check every manifest's seal with this cluster key "
                     "(the file ckptd's --cluster-key names)");
  verify->add_option("--cluster-key-old", cluster_key_old,
                     "during a key rotation: a previous key, also accepted");

  std::string export_job, export_step, format = "safetensors", export_out;
  CLI::App* export_cmd = app.add_subcommand(
      "export",
      "JOB STEP OUT: assemble full tensors from the shards of a committed "
      "step and write them in a format the ecosystem reads");
  export_cmd
      ->add_option("job", export_job,
                   "job id, or a shared tier's job folder (s3://bucket/"
                   "prefix/JOB or a directory)")
      ->required();
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
  gc->add_option("job", gc_job,
                 "job id, or a shared tier's job folder (s3://bucket/prefix/"
                 "JOB or a directory): keep its newest --keep committed steps")
      ->required();
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
  int stale_uploads_min = 60;
  gc->add_option("--stale-uploads-min", stale_uploads_min,
                 "on an object store: also abort the multipart uploads under "
                 "the job folder begun this many minutes ago or earlier")
      ->check(CLI::Range(0, 1 << 20))
      ->capture_default_str();
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

  std::string publish_job, publish_step, topic, cast;
  std::vector<std::string> publish_items;
  CLI::App* publish = app.add_subcommand(
      "publish",
      "JOB STEP --topic T: publish committed STEP (every rank's shard on this "
      "node) as the next version of topic T, for rollout and inference "
      "engines to read");
  publish->add_option("job", publish_job, "job id")->required();
  publish->add_option("step", publish_step, "committed step")->required();
  publish->add_option("--topic", topic, "the topic (e.g. policy)")->required();
  publish
      ->add_option("--items", publish_items,
                   "only the items these globs match (e.g. 'model/*'); "
                   "repeatable")
      ->take_all();
  publish->add_option("--cast", cast,
                      "bf16: float32 items become bfloat16 (as torch's "
                      ".to(torch.bfloat16))");
  publish->add_option("--socket", socket_path, "ckptd's socket");
  publish->add_flag("--json", json, "print JSON");

  CLI::App* topics = app.add_subcommand(
      "topics",
      "the published topics, their newest versions, and which "
      "versions this node holds");
  topics->add_option("--socket", socket_path, "ckptd's socket");
  topics->add_flag("--json", json, "print JSON");

  std::string subscribe_topic;
  CLI::App* subscribe = app.add_subcommand(
      "subscribe",
      "TOPIC: this node's ckptd fetches each new version of TOPIC from its "
      "peers as it is published, until it stops (ckptd --subscribe keeps "
      "it across restarts)");
  subscribe->add_option("topic", subscribe_topic, "the topic")->required();
  subscribe->add_option("--socket", socket_path, "ckptd's socket");
  subscribe->add_flag("--json", json, "print JSON");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : kExitUsage;
  }
  // The shared tier read directly: no ckptd, no data directory.
  if (*inspect && inspect_args.size() == 1 &&
      absl::StartsWith(inspect_args[0], "s3://")) {
    auto fs = OpenStore(inspect_args[0], store);
    if (!fs.ok()) return Fail("inspect", fs.status());
    return Inspect(inspect_args[0], json, fs->get());
  }
  if (*ls && IsStoreLocation(ls_job)) {
    auto fs = OpenStore(ls_job, store);
    if (!fs.ok()) return Fail("ls", fs.status());
    return LsStore(fs->get(), ls_job, json);
  }
  if (*verify && IsStoreLocation(verify_args[0])) {
    if (!cluster_key.empty()) {
      auto keys = ckpt::snapshot::SealKeys::Load(cluster_key, cluster_key_old);
      if (!keys.ok()) return Fail("verify --cluster-key", keys.status());
      ckpt::snapshot::InstallSealKeys(*std::move(keys));
    }
    auto fs = OpenStore(verify_args[0], store);
    if (!fs.ok()) return Fail("verify", fs.status());
    if (absl::EndsWith(verify_args[0], ".ckpt")) {
      return Verify(verify_args, json, fs->get());
    }
    if (verify_args.size() > 2) {
      std::cerr << "ckpt verify: give LOCATION [STEP], or copies\n";
      return kExitUsage;
    }
    return VerifyStore(fs->get(), verify_args[0],
                       verify_args.size() > 1 ? verify_args[1] : "", json);
  }
  if (*export_cmd && IsStoreLocation(export_job)) {
    auto fs = OpenStore(export_job, store);
    if (!fs.ok()) return Fail("export", fs.status());
    return ExportStore(fs->get(), export_job, export_step, format, export_out,
                       json);
  }
  if (*gc && IsStoreLocation(gc_job)) {
    if (gc_memory || keep_option->count() == 0) {
      std::cerr << "ckpt gc: a store's job folder takes --keep N\n";
      return kExitUsage;
    }
    auto fs = OpenStore(gc_job, store);
    if (!fs.ok()) return Fail("gc", fs.status());
    return GcStore(fs->get(), gc_job, keep, absl::Minutes(stale_uploads_min),
                   dry_run, json);
  }
  if (app.count("--data-dir") == 0 && env_dir == nullptr) {
    // ckpt finds ckptd: a running daemon says where its data is.
    const std::string ask =
        socket_path.empty() ? ckpt::client::DefaultSocketPath() : socket_path;
    absl::StatusOr<ckpt::proto::DescribeResponse> daemon =
        ckpt::client::DescribeDaemon(ask, std::chrono::seconds(3));
    if (daemon.ok()) {
      data_dir = daemon->data_dir();
      socket_path = ask;
    }
  }
  if (socket_path.empty()) socket_path = DaemonSocketOf(data_dir);
  if (*ls) return Ls(data_dir, socket_path, ls_job, json);
  if (*publish) {
    return Publish(socket_path, publish_job, publish_step, topic, publish_items,
                   cast, json);
  }
  if (*topics) return Topics(socket_path, json);
  if (*subscribe) return Subscribe(socket_path, subscribe_topic, json);
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
    return InspectStep(data_dir, socket_path, inspect_args[0], inspect_args[1],
                       json);
  }
  if (*verify) {
    if (!cluster_key.empty()) {
      auto keys = ckpt::snapshot::SealKeys::Load(cluster_key, cluster_key_old);
      if (!keys.ok()) return Fail("verify --cluster-key", keys.status());
      ckpt::snapshot::InstallSealKeys(*std::move(keys));
    }
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

}  // namespace ckpt::cli

int main(int argc, char** argv) { return ckpt::cli::Main(argc, argv); }
