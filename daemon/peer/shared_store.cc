#include "daemon/peer/shared_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"

namespace ckpt::daemon {

absl::StatusOr<SharedStore> OpenSharedStore(io::FileSystem* local,
                                            const std::string& dir,
                                            const ObjectStoreOptions& options) {
  SharedStore store;
  if (!io::s3::S3FileSystem::IsS3Path(dir)) {
    RETURN_IF_ERROR(local->CreateDirs(dir));
    store.fs = local;
    return store;
  }
  auto named = [&](const absl::Status& s) {
    return absl::Status(
        s.code(), absl::StrCat("the shared tier ", dir, ": ", s.message()));
  };
  absl::StatusOr<io::s3::S3Uri> uri = io::s3::ParseS3Uri(dir);
  if (!uri.ok()) return named(uri.status());
  io::s3::S3Options s3;
  s3.endpoint = options.endpoint;
  s3.region = options.region;
  s3.path_style = options.path_style;
  s3.max_attempts = options.max_attempts;
  absl::StatusOr<io::s3::Credentials> credentials =
      io::s3::ResolveCredentials(options.credentials);
  if (!credentials.ok()) return named(credentials.status());
  s3.credentials = *std::move(credentials);
  if (options.transfer.part_bytes < (5 << 20)) {
    return named(absl::InvalidArgumentError(
        "parts must be at least 5 MiB (S3's smallest but the last)"));
  }
  absl::StatusOr<std::unique_ptr<io::s3::S3Client>> client =
      io::s3::S3Client::Create(std::move(s3));
  if (!client.ok()) return named(client.status());
  store.client = *std::move(client);
  store.owned =
      std::make_unique<io::s3::S3FileSystem>(store.client, options.transfer);
  store.fs = store.owned.get();
  return store;
}

}  // namespace ckpt::daemon
