// S3Client: the operations of S3's REST API that the object-store tier uses
// (objects whole and by byte range, listings, multipart uploads), against
// AWS or any S3-compatible server, path-style or virtual-hosted. Every request
// is signed (Signature Version 4). A failure a retry may cure (a 5xx, 429
// SlowDown, a reset or refused connection, a timeout) is retried with capped
// exponential backoff and full jitter; any other, or the last, gives an error
// naming the operation, bucket, key, HTTP status and S3's error code and
// message, converted from S3's error space here only: 404 NotFound, 403
// PermissionDenied, 416 OutOfRange, 400 InvalidArgument, 409
// FailedPrecondition, retried ones (and BadDigest: bytes damaged on the
// way) Unavailable.
//
// Thread-safety: thread-safe; calls run at once on connections of their own.
#ifndef CKPT_IO_S3_S3_CLIENT_H_
#define CKPT_IO_S3_S3_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "io/s3/http_transport.h"
#include "io/s3/sigv4.h"

namespace ckpt::io::s3 {

struct S3Options {
  // "http://127.0.0.1:8333", "https://minio.example:9000"; empty: AWS's
  // endpoint for `region`.
  std::string endpoint;
  std::string region = "us-east-1";
  // Path-style addressing (endpoint/bucket/key), which non-AWS servers use;
  // else virtual-hosted (bucket.endpoint/key).
  bool path_style = true;
  Credentials credentials;
  // Every object and part sent carries its CRC32C (x-amz-checksum-crc32c),
  // which the server checks: bytes damaged on the way are refused (BadDigest)
  // and sent again.
  bool checksums = true;
  int max_attempts = 6;
  absl::Duration first_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  HttpTimeouts timeouts;
};

// s3://bucket/prefix
struct S3Uri {
  std::string bucket;
  std::string prefix;  // without a leading or trailing '/'; may be empty
  std::string ToString() const;
};
// InvalidArgument naming what is wrong with `uri`.
absl::StatusOr<S3Uri> ParseS3Uri(absl::string_view uri);

struct ObjectInfo {
  std::string key;
  uint64_t size = 0;
  std::string etag;
};

// A part sent: its ETag and the checksum it was sent with.
struct UploadedPart {
  std::string etag;
  std::string crc32c;  // base64; empty without checksums
};

struct MultipartUpload {
  std::string key;
  std::string upload_id;
  absl::Time initiated;
};

class S3Client {
 public:
  // InvalidArgument for an endpoint that is not http(s)://host[:port].
  static absl::StatusOr<std::unique_ptr<S3Client>> Create(S3Options options);

  absl::Status CreateBucket(const std::string& bucket);
  absl::Status PutObject(const std::string& bucket, const std::string& key,
                         absl::Span<const uint8_t> body);
  absl::StatusOr<std::string> GetObject(const std::string& bucket,
                                        const std::string& key);
  // The object's bytes [offset, offset + out.size()) into `out`, in place.
  absl::Status GetRange(const std::string& bucket, const std::string& key,
                        uint64_t offset, absl::Span<uint8_t> out);
  absl::StatusOr<ObjectInfo> HeadObject(const std::string& bucket,
                                        const std::string& key);
  // OK if there was none.
  absl::Status DeleteObject(const std::string& bucket, const std::string& key);
  // Every object whose key starts with `prefix`, by key (all pages, of
  // `page_size` keys each).
  absl::StatusOr<std::vector<ObjectInfo>> ListObjects(const std::string& bucket,
                                                      const std::string& prefix,
                                                      int page_size = 1000);
  // One level of the keys under `prefix` (which ends with '/', or is empty),
  // as a directory: the objects there, and the names of the "directories"
  // (keys with a further '/'), each once, without `prefix`.
  struct Level {
    std::vector<ObjectInfo> objects;
    std::vector<std::string> directories;
  };
  absl::StatusOr<Level> ListLevel(const std::string& bucket,
                                  const std::string& prefix);

  absl::StatusOr<std::string> CreateMultipartUpload(const std::string& bucket,
                                                    const std::string& key);
  // Part `number` (1 to 10000).
  absl::StatusOr<UploadedPart> UploadPart(const std::string& bucket,
                                          const std::string& key,
                                          const std::string& upload_id,
                                          int number,
                                          absl::Span<const uint8_t> body);
  // The parts in part order (part i + 1 is parts[i]).
  absl::Status CompleteMultipartUpload(const std::string& bucket,
                                       const std::string& key,
                                       const std::string& upload_id,
                                       const std::vector<UploadedPart>& parts);
  absl::Status AbortMultipartUpload(const std::string& bucket,
                                    const std::string& key,
                                    const std::string& upload_id);
  // Uploads begun and neither completed nor aborted, under `prefix`.
  absl::StatusOr<std::vector<MultipartUpload>> ListMultipartUploads(
      const std::string& bucket, const std::string& prefix);

  const S3Options& options() const { return options_; }

 private:
  struct Call;
  S3Client(S3Options options, std::string scheme, std::string authority);
  // Signs and sends `call`, retrying what a retry may cure.
  absl::StatusOr<HttpResponse> Run(Call& call);
  absl::StatusOr<HttpResponse> Attempt(const Call& call);
  // ListObjectsV2's pages, with `delimiter` (may be empty).
  absl::StatusOr<Level> List(const std::string& bucket,
                             const std::string& prefix,
                             const std::string& delimiter, int page_size);

  const S3Options options_;
  const std::string scheme_;     // "http" or "https"
  const std::string authority_;  // host[:port] of the endpoint
  HttpTransport transport_;
};

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_S3_CLIENT_H_
