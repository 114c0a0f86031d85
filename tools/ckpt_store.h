// ckpt on the shared tier read directly, with no ckptd (a new cluster, an
// operator's laptop): `ckpt ls s3://bucket/prefix[/JOB]` and
// `ckpt verify s3://bucket/prefix/JOB [STEP]` (or a shared directory's path
// in place of the URI), from the copies and the commit markers the tier
// holds. An object store is reached with the --s3-* options and
// credentials as ckptd finds them.
#ifndef CKPT_TOOLS_CKPT_STORE_H_
#define CKPT_TOOLS_CKPT_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "io/file_system.h"
#include "io/s3/credentials.h"

namespace ckpt::cli {

// How the command reaches an object store (its --s3-* options).
struct StoreOptions {
  std::string endpoint;
  std::string region = "us-east-1";
  bool path_style = true;
  io::s3::CredentialSources credentials;
};

// The file system holding `location`: an object store's for an s3:// URI,
// else the local one.
absl::StatusOr<std::unique_ptr<io::FileSystem>> OpenStore(
    const std::string& location, const StoreOptions& options);

// The jobs under `location` with their committed steps, or, when
// `location` is a job's folder, its steps: committed (a marker) or not,
// the ranks' copies there and their bytes.
int LsStore(io::FileSystem* fs, const std::string& location, bool json);

// Every copy of the committed steps of the job at `location` (or of `step`
// only), each chunk read and checked (and each seal, with a cluster key).
int VerifyStore(io::FileSystem* fs, const std::string& location,
                const std::string& step_text, bool json);

}  // namespace ckpt::cli

#endif  // CKPT_TOOLS_CKPT_STORE_H_
