#include "daemon/server/shared_tier_flags.h"

#include "io/file_system.h"

namespace ckpt::daemon {

void AddSharedTierOptions(CLI::App& app, CkptdFlags& f) {
  app.add_option("--shared-dir", f.shared_dir,
                 "tier T3: a directory every node sees (NFS, Lustre, any "
                 "POSIX mount) that persisted shards are also copied to");
  app.add_option("--shared-uri", f.shared_uri,
                 "tier T3 on an object store with S3's API: "
                 "s3://bucket/prefix (or a directory, as --shared-dir)");
  app.add_option("--s3-endpoint", f.s3_endpoint,
                 "the object store's endpoint, http(s)://host[:port] "
                 "(default: AWS's for --s3-region)");
  app.add_option("--s3-region", f.s3_region, "the object store's region")
      ->capture_default_str();
  app.add_option("--s3-path-style", f.s3_path_style,
                 "path-style addressing (endpoint/bucket/key), as servers "
                 "other than AWS's use; false: bucket.endpoint/key")
      ->capture_default_str();
  app.add_option("--s3-profile", f.s3_profile,
                 "the shared credentials file's profile (default: "
                 "$AWS_PROFILE, else default); credentials come from "
                 "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY first");
  app.add_option("--s3-credentials-file", f.s3_credentials_file,
                 "the shared credentials file (default: "
                 "$AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials)");
  app.add_option("--s3-part-mib", f.s3_part_mib,
                 "the parts of an upload to the object store, in MiB")
      ->check(CLI::Range(uint64_t{5}, uint64_t{5120}))
      ->capture_default_str();
  app.add_option("--s3-concurrency", f.s3_concurrency,
                 "parts or ranges of one object in flight at once")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  app.add_option("--shared-every", f.shared_every,
                 "copy the steps that are multiples of this to --shared-dir")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
      ->capture_default_str();
  app.add_option("--keep-shared", f.keep_shared,
                 "committed steps kept in --shared-dir")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
}

absl::Status ApplySharedTierFlags(const CkptdFlags& f, SharedTierOptions* out) {
  if (!f.shared_dir.empty() && !f.shared_uri.empty()) {
    return absl::InvalidArgumentError(
        "--shared-dir and --shared-uri name the same tier: give one");
  }
  *out = {.dir = f.shared_uri.empty() ? f.shared_dir : f.shared_uri,
          .every = f.shared_every,
          .keep = f.keep_shared};
  ObjectStoreOptions& s3 = out->object_store;
  s3.endpoint = f.s3_endpoint;
  s3.region = f.s3_region;
  s3.path_style = f.s3_path_style;
  s3.credentials.profile = f.s3_profile;
  s3.credentials.credentials_file = f.s3_credentials_file;
  s3.transfer.part_bytes = f.s3_part_mib << 20;
  s3.transfer.concurrency = f.s3_concurrency;
  // In the memory tier's tmpfs (a name no job has, which its scan skips):
  // a restore reads the landed copy at memory speed.
  out->landing_dir = io::JoinPath(f.staging_dir, ".shared-landing");
  return absl::OkStatus();
}

}  // namespace ckpt::daemon
