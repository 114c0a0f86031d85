// ckpt-bench: what its subcommands share. Each subcommand lives in its own
// file (ckpt_bench_io.cc, ckpt_bench_save.cc, ckpt_bench_torch.cc,
// ckpt_bench_control_plane.cc, ckpt_bench_recovery.cc, ckpt_bench_codec.cc),
// the shared helpers in ckpt_bench_common.cc, the command line in
// ckpt_bench.cc. Each Run* runs one benchmark on the calling thread, prints its
// report (one JSON object with
// --json) and returns the process's exit code.
#ifndef CKPT_TOOLS_CKPT_BENCH_H_
#define CKPT_TOOLS_CKPT_BENCH_H_

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace ckpt::bench {

std::string RunCapture(const std::string& cmd);

// fio's bandwidth in MiB/s for one sequential pass.
double Fio(const std::string& file, bool write, uint64_t size_mib,
           unsigned iodepth);

// Starts a ckptd for the benchmark (with `flags` besides its own); returns
// its pid.
pid_t StartDaemon(const std::string& dir, const std::string& staging,
                  uint64_t budget_mib,
                  const std::vector<std::string>& flags = {});

// The bench's ckptd: stopped, and its staging directory removed, however the
// bench ends.
struct BenchDaemon {
  pid_t pid = -1;
  std::string staging;
  ~BenchDaemon() {
    if (pid > 0) {
      ::kill(pid, SIGTERM);
      ::waitpid(pid, nullptr, 0);
    }
    std::error_code ec;
    std::filesystem::remove_all(staging, ec);
  }
};

// ckptd's restores of `runs` steps of `size_mib` from the bucket at `uri`,
// end to end, in seconds (tools/ckpt_bench_s3_ckptd.cc).
absl::StatusOr<std::vector<double>> CkptdRestoreSeconds(
    const std::string& dir, const std::string& uri, const std::string& endpoint,
    const std::string& access_key, const std::string& secret_key,
    uint64_t size_mib, int runs);
// The shared tier on an object store against boto3 (tools/ckpt_bench_s3.cc).
int RunS3(const std::string& dir, const std::string& uri,
          const std::string& endpoint, uint64_t size_mib, int runs,
          uint64_t part_mib, int concurrency, bool json);
int RunIo(const std::string& dir, uint64_t size_mib, int runs, int threads,
          bool json);

int RunSave(const std::string& dir, std::vector<uint64_t> sizes_mib, int runs,
            int warmup, bool json, bool fork);

// `ckpt-bench torch`: bench_torch.py (next to the ckpt Python package in the
// build tree) against the benchmark's own ckptd.
int RunTorch(const std::string& dir, uint64_t state_mib, int runs, bool json,
             const std::string& host_snapshot, bool huge_pages,
             std::string python);

// `ckpt-bench control-plane`: `ranks` ranks of one job, spread over `nodes`
// etcd coordinators (one per simulated ckptd, voting for their ranks in
// parallel), vote for one step; the time from the first vote to the commit.
// Against its own etcd on loopback unless `etcd` names one.
int RunControlPlane(const std::string& dir, std::string etcd, int ranks,
                    int nodes, int runs, bool json);

// `ckpt-bench recovery`: the time a job takes to come back from a lost node
// (detection, rendezvous, restore from peer replicas), against a plain TCP
// copy of the same bytes.
int RunRecovery(const std::string& dir, uint64_t state_mib, bool json);

// `ckpt-bench recovery --redundancy rs:K+M`: the erasure-coded peer tier
// against M full replicas on six ckptd (peer memory, encode speed, the
// restore of M lost nodes' ranks, recovery time). ckpt_bench_redundancy.cc.
int RunRedundancy(const std::string& dir, uint64_t state_mib,
                  const std::string& redundancy, bool json);

// `ckpt-bench publish`: a version's reach to 1..8 subscriber ckptds through
// the chain, against the source sending to all 8 itself and against gloo's
// broadcast; load_into against a memcpy. ckpt_bench_publish.cc.
int RunPublish(const std::string& dir, uint64_t mib, uint64_t rate_mib,
               int runs, bool json);

// `ckpt-bench codec`: real training state from gen_training_state.py in
// `data`: ckpt's stored size and codec speed against byte-shuffle + zstd -1
// (one core), bytes written by incremental saves (fine-tuning with ~90%
// frozen, dense training), persist and restore (end of a chain) against fio
// on `dir`.
int RunCodec(const std::string& data, const std::string& dir, bool json);

// `ckpt-bench gpu`: the CUDA device's copies into and out of a registered
// staging slot, chunk hashes and byte-shuffle against the CUDA runtime's
// copies (ckpt_bench_gpu.cc). Exits 1 without a GPU.
int RunGpu(const std::string& dir, uint64_t size_mib, int runs, bool json);

}  // namespace ckpt::bench

#endif  // CKPT_TOOLS_CKPT_BENCH_H_
