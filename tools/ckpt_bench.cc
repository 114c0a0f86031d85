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
//   ckpt-bench recovery [--dir DIR] [--state-mib N] [--redundancy rs:K+M]
//   ckpt-bench publish [--dir DIR] [--mib N] [--rate-mib N] [--runs N]
//   [--json]
//
// `recovery` loses a node of a job on three local ckptd with peer replication
// and times detection, rendezvous and the restore from the replicas (against
// a loopback TCP copy of the same bytes).
#include "tools/ckpt_bench.h"

#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "absl/strings/str_cat.h"
#include "client/checkpointer.h"
#include "io/file_system.h"
#include "nlohmann/json.hpp"
#include "tools/bench_stats.h"
#include "tools/metrics_text.h"
#include "tools/process.h"

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
  std::string shared_uri, s3_endpoint;
  io_cmd->add_option("--shared-uri", shared_uri,
                     "s3://bucket/prefix: the shared tier on an object store "
                     "against boto3 and the POSIX shared tier instead");
  uint64_t s3_part_mib = 16;
  int s3_concurrency = 8;
  io_cmd->add_option("--s3-part-mib", s3_part_mib, "upload parts, in MiB")
      ->check(CLI::Range(uint64_t{5}, uint64_t{5120}))
      ->capture_default_str();
  io_cmd
      ->add_option("--s3-concurrency", s3_concurrency,
                   "parts or ranges in flight at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  io_cmd->add_option("--s3-endpoint", s3_endpoint,
                     "the object store (default: a local SeaweedFS started in "
                     "--dir); credentials as ckptd finds them");
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
  std::string redundancy;
  rec_cmd->add_option(
      "--redundancy", redundancy,
      "rs:K+M: six ckptd, M of them lost at once, parity against M replicas");
  uint64_t publish_mib = 256, publish_rate_mib = 64;
  CLI::App* publish_cmd = app.add_subcommand(
      "publish",
      "a version's reach to 1..8 subscriber ckptds (a chain, sends capped) "
      "vs the source sending to each, vs gloo's broadcast; load_into vs "
      "memcpy");
  publish_cmd->add_option("--dir", dir, "where the nodes keep their data");
  publish_cmd
      ->add_option("--mib", publish_mib,
                   "the published weights, MiB (every subscriber holds a "
                   "copy per topic: 15 copies in all)")
      ->check(CLI::Range(4, 1 << 16))
      ->capture_default_str();
  publish_cmd
      ->add_option("--rate-mib", publish_rate_mib,
                   "each daemon's --peer-send-rate, MiB/s")
      ->check(CLI::Range(1, 1 << 16))
      ->capture_default_str();
  publish_cmd->add_option("--runs", runs, "versions per count; medians")
      ->check(CLI::Range(1, 100));
  publish_cmd->add_flag("--json", json, "print one JSON object");
  std::string codec_data = "build/bench-data";
  CLI::App* codec_cmd = app.add_subcommand(
      "codec",
      "real training state (tools/gen_training_state.py): stored size and "
      "codec speed vs byte-shuffle + zstd -1, incremental saves, persist and "
      "restore vs fio");
  codec_cmd
      ->add_option("--data", codec_data,
                   "the generator's output directory (index.json)")
      ->capture_default_str();
  codec_cmd->add_option("--dir", dir, "directory on the disk to measure");
  codec_cmd->add_flag("--json", json, "print one JSON object");
  uint64_t gpu_mib = 4096;
  CLI::App* gpu_cmd = app.add_subcommand(
      "gpu",
      "the CUDA device's slot copies, chunk hashes and shuffle vs the CUDA "
      "runtime's copies (needs a GPU)");
  gpu_cmd->add_option("--size-mib", gpu_mib, "bytes per pass, in MiB")
      ->check(CLI::Range(4, 1 << 20));
  gpu_cmd->add_option("--runs", runs, "passes; medians are reported")
      ->check(CLI::Range(1, 100));
  gpu_cmd->add_option("--dir", dir, "directory of the benchmark's ckptd");
  gpu_cmd->add_flag("--json", json, "print one JSON object");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  if (*codec_cmd) return ckpt::bench::RunCodec(codec_data, dir, json);
  if (*publish_cmd) {
    return ckpt::bench::RunPublish(dir + "/ckpt-bench-publish", publish_mib,
                                   publish_rate_mib, runs, json);
  }
  if (*gpu_cmd) return ckpt::bench::RunGpu(dir, gpu_mib, runs, json);
  if (*save_cmd) {
    return ckpt::bench::RunSave(dir, sizes_mib, runs, warmup, json,
                                save_snapshot == "fork");
  }
  if (*torch_cmd) {
    return ckpt::bench::RunTorch(dir, state_mib, runs, json, host_snapshot,
                                 huge_pages, torch_python);
  }
  if (*rec_cmd && !redundancy.empty()) {
    return ckpt::bench::RunRedundancy(dir + "/ckpt-bench-redundancy",
                                      recovery_mib, redundancy, json);
  }
  if (*rec_cmd)
    return ckpt::bench::RunRecovery(dir + "/ckpt-bench-recovery", recovery_mib,
                                    json);
  if (*cp_cmd) {
    return ckpt::bench::RunControlPlane(dir + "/ckpt-bench-etcd", etcd,
                                        cp_ranks, cp_nodes, runs, json);
  }
  if (!shared_uri.empty()) {
    return ckpt::bench::RunS3(dir, shared_uri, s3_endpoint, size_mib, runs,
                              s3_part_mib, s3_concurrency, json);
  }
  return ckpt::bench::RunIo(dir, size_mib, runs, threads, json);
}
