// Where the shared tier (T3) keeps its copies: a POSIX directory every node
// mounts, or a bucket and prefix of an object store with S3's API
// ("s3://bucket/prefix", io/s3), reached through the same io::FileSystem
// interface. Opening an object store checks its configuration (the URI, the
// endpoint, that credentials were found) but not that the server answers: a
// server that is down or refuses the credentials fails the copies (retried,
// logged, the steps staying at the lower tiers), never ckptd's start.
#ifndef CKPT_DAEMON_PEER_SHARED_STORE_H_
#define CKPT_DAEMON_PEER_SHARED_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "io/file_system.h"
#include "io/s3/credentials.h"
#include "io/s3/s3_client.h"
#include "io/s3/s3_file_system.h"

namespace ckpt::daemon {

struct ObjectStoreOptions {
  std::string endpoint;  // empty: AWS's for the region
  std::string region = "us-east-1";
  bool path_style = true;
  io::s3::CredentialSources credentials;
  io::s3::S3FileSystemOptions transfer;  // part size, ranges, concurrency
  int max_attempts = 6;
};

struct SharedStore {
  io::FileSystem* fs = nullptr;              // where the copies are
  std::unique_ptr<io::FileSystem> owned;     // an object store's
  std::shared_ptr<io::s3::S3Client> client;  // an object store's, else null
  bool object_store() const { return client != nullptr; }
};

// `dir` is a directory (through `local`) or an s3:// URI.
absl::StatusOr<SharedStore> OpenSharedStore(io::FileSystem* local,
                                            const std::string& dir,
                                            const ObjectStoreOptions& options);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_SHARED_STORE_H_
