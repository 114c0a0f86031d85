// Where the object-store tier's credentials come from, the first source that
// has them winning, as AWS's own tools look: the ones given (ckptd's config
// file), the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
// AWS_SESSION_TOKEN), then the shared credentials file (AWS_SHARED_
// CREDENTIALS_FILE, else ~/.aws/credentials) under a profile (the one given,
// else AWS_PROFILE, else "default"). The error of none names every place
// looked at.
#ifndef CKPT_IO_S3_CREDENTIALS_H_
#define CKPT_IO_S3_CREDENTIALS_H_

#include <string>

#include "absl/status/statusor.h"
#include "io/s3/sigv4.h"

namespace ckpt::io::s3 {

struct CredentialSources {
  Credentials given;             // used when its key id is not empty
  std::string profile;           // empty: AWS_PROFILE, else "default"
  std::string credentials_file;  // empty: as AWS's tools find it
};

absl::StatusOr<Credentials> ResolveCredentials(
    const CredentialSources& sources);

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_CREDENTIALS_H_
