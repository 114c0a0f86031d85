// ckpt-bench io --shared-uri s3://bucket/prefix: the shared tier on an object
// store against boto3 (tools/bench_boto3.py: upload_file and
// download_fileobj with TransferManager's defaults) moving the same step to
// and from the same server, and against the POSIX shared tier's copy of it,
// in the same run. Without --s3-endpoint a local SeaweedFS (tools/local_s3)
// is started in --dir. Measured, medians of --runs:
//   s3_upload_vs_boto3: boto3's upload time over ckpt's (the shared tier's
//     copy: the step's shard file sent as a multipart upload);
//   s3_restore_vs_boto3: boto3's download into memory over ckpt's restore
//     into a rank's memory (ranged GETs at once, every chunk checked);
//   s3_ckptd_restore_vs_boto3: the same through ckptd, end to end: a rank's
//     Restore on a node with none of the step, its copy streamed from the
//     bucket as the rank reads it (tools/ckpt_bench_s3_ckptd.cc);
//   s3_vs_posix_shared: ckpt's upload time over the POSIX shared tier's copy
//     of the same file (written, fsynced, renamed) into --dir;
//   s3_upload_cpu_vs_boto3: the CPU time boto3's process spends on an upload
//     over ckpt's (the client's cost per byte: on a small machine the server
//     shares the cores, and the client's CPU is the server's loss).
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "io/file_system.h"
#include "io/s3/credentials.h"
#include "io/s3/s3_client.h"
#include "io/s3/s3_file_system.h"
#include "nlohmann/json.hpp"
#include "snapshot/format.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tools/bench_stats.h"
#include "tools/ckpt_bench.h"
#include "tools/local_s3.h"

namespace ckpt::bench {
namespace {

using tools::Median;
using tools::Seconds;

[[noreturn]] void Fail(const std::string& what, const absl::Status& s) {
  std::cerr << "ckpt-bench: " << what << ": " << s << "\n";
  std::exit(1);
}

// A persisted shard of `mib` MiB of incompressible bytes, stored raw (what the
// tier copies is bytes: the codec is not measured here).
std::string MakeShard(const std::string& dir, uint64_t mib) {
  const std::string path =
      io::JoinPath(dir, snapshot::ShardFileName(1, 0, ".ckpt"));
  std::vector<uint8_t> data(mib << 20);
  std::mt19937_64 rng(7);
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    const uint64_t v = rng();
    std::memcpy(&data[i], &v, 8);
  }
  snapshot::ShardWriterOptions options;
  options.codec.codec = proto::CODEC_NONE;
  snapshot::ShardWriter writer(io::DefaultFileSystem(), path,
                               {"bench", 1, 0, 1}, options);
  absl::Status s = writer.AddBytes("data", data);
  if (s.ok()) s = writer.Commit().status();
  if (!s.ok()) Fail("writing the step", s);
  return path;
}

// This process's CPU time so far (every thread's), in seconds.
double CpuSeconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  auto s = [](const timeval& t) { return t.tv_sec + t.tv_usec * 1e-6; };
  return s(u.ru_utime) + s(u.ru_stime);
}

// The shard's file copied to `to` through `fs` as the shared tier copies it;
// seconds. `cpu`, if given, gets the CPU seconds it took.
double Copy(io::FileSystem* fs, const std::string& shard, const std::string& to,
            bool rename, double* cpu = nullptr,
            io::FileSystem* from = io::DefaultFileSystem()) {
  const auto start = std::chrono::steady_clock::now();
  const double cpu0 = CpuSeconds();
  absl::StatusOr<snapshot::SelfContained> view =
      snapshot::OpenSelfContained(from, shard);
  if (!view.ok()) Fail("opening the step", view.status());
  const std::string target = rename ? to + ".partial" : to;
  absl::Status s = snapshot::WriteSelfContained(fs, *view, target);
  if (s.ok() && rename) s = fs->Rename(target, to);
  if (s.ok() && rename) s = fs->SyncDir(io::DirName(to));
  if (!s.ok()) Fail("copying the step to " + to, s);
  if (cpu != nullptr) *cpu = CpuSeconds() - cpu0;
  return Seconds(start);
}

// The step read from `path` in the store into `into` (a rank's memory), every
// chunk checked; seconds.
double Restore(io::FileSystem* fs, const std::string& path,
               std::vector<uint8_t>& into) {
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
      snapshot::ShardReader::Open(fs, path);
  if (!reader.ok()) Fail("opening " + path, reader.status());
  absl::Status s = (*reader)->ReadItem("data", absl::MakeSpan(into));
  if (!s.ok()) Fail("restoring " + path, s);
  return Seconds(start);
}

// boto3's seconds for the same file (tools/bench_boto3.py).
nlohmann::json Boto3(const std::string& endpoint,
                     const io::s3::Credentials& credentials,
                     const std::string& bucket, const std::string& key,
                     const std::string& file, int runs,
                     const std::string& dir) {
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe");
  const std::string python =
      (self.parent_path() / "../torch-venv/bin/python").lexically_normal();
  const std::string script =
      (self.parent_path() / "../python/bench_boto3.py").lexically_normal();
  const std::string out = dir + "/boto3.json";
  const std::string cmd =
      absl::StrCat("AWS_ACCESS_KEY_ID='", credentials.access_key_id,
                   "' AWS_SECRET_ACCESS_KEY='", credentials.secret_access_key,
                   "' '", python, "' '", script, "' '", endpoint, "' '", bucket,
                   "' '", key, "' '", file, "' ", runs, " > '", out, "'");
  if (std::system(cmd.c_str()) != 0) {
    Fail("boto3", absl::InternalError(absl::StrCat(
                      "`", python, " ", script,
                      "` failed (tools/torch-venv.sh installs boto3)")));
  }
  std::ifstream in(out);
  return nlohmann::json::parse(in, nullptr, false);
}

}  // namespace

int RunS3(const std::string& dir, const std::string& uri,
          const std::string& endpoint_flag, uint64_t size_mib, int runs,
          uint64_t part_mib, int concurrency, bool json) {
  absl::StatusOr<io::s3::S3Uri> where = io::s3::ParseS3Uri(uri);
  if (!where.ok()) Fail("--shared-uri", where.status());
  const std::string work = dir + "/ckpt-bench-s3";
  std::error_code ec;
  std::filesystem::remove_all(work, ec);
  std::filesystem::create_directories(work + "/posix", ec);
  std::unique_ptr<tools::LocalS3> local;
  io::s3::S3Options options;
  options.endpoint = endpoint_flag;
  if (endpoint_flag.empty()) {
    local = std::make_unique<tools::LocalS3>(work + "/weed");
    if (!local->Start()) {
      Fail("starting SeaweedFS", absl::UnavailableError(local->log_path()));
    }
    options.endpoint = local->endpoint();
    options.credentials = {local->access_key(), local->secret_key()};
  } else {
    absl::StatusOr<io::s3::Credentials> c = io::s3::ResolveCredentials({});
    if (!c.ok()) Fail("credentials", c.status());
    options.credentials = *c;
  }
  const std::string endpoint = options.endpoint;
  const io::s3::Credentials credentials = options.credentials;
  absl::StatusOr<std::unique_ptr<io::s3::S3Client>> made =
      io::s3::S3Client::Create(std::move(options));
  if (!made.ok()) Fail("the S3 client", made.status());
  std::shared_ptr<io::s3::S3Client> client = *std::move(made);
  if (absl::Status s = client->CreateBucket(where->bucket); !s.ok()) {
    Fail("creating the bucket", s);
  }
  io::s3::S3FileSystem fs(
      client, {.part_bytes = part_mib << 20, .concurrency = concurrency});
  const std::string shard = MakeShard(work, size_mib);
  const std::string name = io::BaseName(shard);
  const std::string key =
      where->prefix.empty() ? name : where->prefix + "/" + name;
  const std::string object = absl::StrCat("s3://", where->bucket, "/", key);
  const uint64_t bytes = std::filesystem::file_size(shard);
  std::vector<uint8_t> rank(size_mib << 20, 1);  // a rank's tensors, touched
  std::vector<double> up, up_cpu, down, posix;
  for (int run = 0; run < runs; ++run) {
    posix.push_back(Copy(io::DefaultFileSystem(), shard,
                         work + "/posix/" + name, /*rename=*/true));
    up.push_back(
        Copy(&fs, shard, object, /*rename=*/false, &up_cpu.emplace_back()));
    down.push_back(Restore(&fs, object, rank));
  }
  rank = {};  // the ckptd run's rank has its own
  absl::StatusOr<std::vector<double>> through_ckptd = CkptdRestoreSeconds(
      work + "/ckptd", uri + "/ckptd", endpoint, credentials.access_key_id,
      credentials.secret_access_key, size_mib, runs);
  if (!through_ckptd.ok()) Fail("ckptd's restore", through_ckptd.status());
  nlohmann::json boto = Boto3(endpoint, credentials, where->bucket,
                              key + ".boto3", shard, runs, work);
  if (!boto.is_object()) Fail("boto3", absl::DataLossError("no JSON"));
  const double ckpt_up = Median(up), ckpt_down = Median(down);
  const double boto_up = Median(boto["upload_s"].get<std::vector<double>>());
  const double boto_down =
      Median(boto["download_s"].get<std::vector<double>>());
  const double mib = static_cast<double>(bytes) / (1 << 20);
  nlohmann::json j;
  j["benchmark"] = "io_s3";
  j["endpoint"] = endpoint;
  j["step_bytes"] = bytes;
  j["runs"] = runs;
  j["part_mib"] = part_mib;
  j["concurrency"] = concurrency;
  j["upload_mib_s"] = mib / ckpt_up;
  j["boto3_upload_mib_s"] = mib / boto_up;
  j["restore_mib_s"] = mib / ckpt_down;
  j["boto3_download_mib_s"] = mib / boto_down;
  j["posix_shared_mib_s"] = mib / Median(posix);
  j["s3_upload_vs_boto3"] = boto_up / ckpt_up;
  j["s3_restore_vs_boto3"] = boto_down / ckpt_down;
  j["ckptd_restore_mib_s"] = mib / Median(*through_ckptd);
  j["s3_ckptd_restore_vs_boto3"] = boto_down / Median(*through_ckptd);
  j["s3_vs_posix_shared"] = ckpt_up / Median(posix);
  j["upload_cpu_s"] = Median(up_cpu);
  j["boto3_upload_cpu_s"] =
      Median(boto["upload_cpu_s"].get<std::vector<double>>());
  j["s3_upload_cpu_vs_boto3"] =
      j["boto3_upload_cpu_s"].get<double>() / Median(up_cpu);
  std::filesystem::remove_all(work, ec);
  if (json) {
    std::cout << j.dump() << "\n";
  } else {
    std::printf(
        "%.0f MiB step, %s:\n  upload %.0f MiB/s (boto3 %.0f): %.2f\n"
        "  restore %.0f MiB/s (boto3 %.0f): %.2f\n"
        "  ckptd's restore %.0f MiB/s: %.2f\n"
        "  upload over the POSIX shared tier's copy (%.0f MiB/s): %.2f\n"
        "  upload CPU %.2f s (boto3 %.2f s): %.2f\n",
        mib, endpoint.c_str(), mib / ckpt_up, mib / boto_up,
        j["s3_upload_vs_boto3"].get<double>(), mib / ckpt_down, mib / boto_down,
        j["s3_restore_vs_boto3"].get<double>(),
        j["ckptd_restore_mib_s"].get<double>(),
        j["s3_ckptd_restore_vs_boto3"].get<double>(), mib / Median(posix),
        j["s3_vs_posix_shared"].get<double>(), j["upload_cpu_s"].get<double>(),
        j["boto3_upload_cpu_s"].get<double>(),
        j["s3_upload_cpu_vs_boto3"].get<double>());
  }
  return 0;
}

}  // namespace ckpt::bench
