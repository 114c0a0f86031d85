// ckpt on the shared tier read directly, with no ckptd (a new cluster, an
// operator's laptop): `ckpt ls s3://bucket/prefix[/JOB]`,
// `ckpt verify s3://bucket/prefix/JOB [STEP]`,
// `ckpt export s3://bucket/prefix/JOB STEP OUT` and
// `ckpt gc s3://bucket/prefix/JOB --keep N` (or a shared directory's path
// in place of the URI), from the copies and the commit markers the tier
// holds. An object store is reached with the --s3-* options and
// credentials as ckptd finds them.
#ifndef CKPT_TOOLS_CKPT_STORE_H_
#define CKPT_TOOLS_CKPT_STORE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
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

// The committed `step` of the job at `location` as one safetensors file
// `out` (full tensors, assembled from every rank's copy, each chunk checked).
int ExportStore(io::FileSystem* fs, const std::string& location,
                const std::string& step_text, const std::string& format,
                const std::string& out, bool json);

// Retention at `location` (a job's folder): the newest `keep` committed
// steps stay with the copies they read chunks from; older steps go, their
// markers before their copies (snapshot/shared_layout.h). A ckptd copying
// to the same folder keeps its own --keep-shared: the smaller wins. On an
// object store, the multipart uploads under the folder begun more than
// `stale_uploads` ago are aborted too (those of a node that crashed and
// never copied that shard again; a live one finishes long before).
int GcStore(io::FileSystem* fs, const std::string& location, int keep,
            absl::Duration stale_uploads, bool dry_run, bool json);

}  // namespace ckpt::cli

#endif  // CKPT_TOOLS_CKPT_STORE_H_
