// S3Upload: a WritableFile that is an object being uploaded. Bytes arrive in
// order (a write at any other offset is Unimplemented) and go out in parts
// of `part_bytes`, up to `concurrency` parts in flight on threads of the
// upload's own; Close() sends what is left and completes the upload, so the
// object appears whole then and not before (one PutObject when it all fits
// in one part). An upload never closed, or failed, is aborted: nothing of
// it stays on the server. Sync() waits for the parts sent so far; the
// object's durability is the server's once Close() returned OK.
//
// Thread-safety: one thread at a time, as WritableFile.
#ifndef CKPT_IO_S3_S3_UPLOAD_H_
#define CKPT_IO_S3_S3_UPLOAD_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "io/file_system.h"
#include "io/s3/s3_client.h"
#include "io/thread_pool.h"

namespace ckpt::io::s3 {

class S3Upload : public WritableFile {
 public:
  S3Upload(S3Client* client, std::string path, std::string bucket,
           std::string key, uint64_t part_bytes, int concurrency);
  ~S3Upload() override;

  absl::Status Write(uint64_t offset, AlignedBuffer buffer) override;
  absl::Status WriteBorrowed(uint64_t offset,
                             absl::Span<const uint8_t> bytes) override;
  absl::Status Flush() override;
  absl::Status Allocate(uint64_t size) override;
  absl::Status Truncate(uint64_t size) override;
  absl::Status Sync() override { return Flush(); }
  absl::Status DataSync() override { return Flush(); }
  absl::Status Close() override;
  const std::string& path() const override { return path_; }

 private:
  absl::Status Append(uint64_t offset, absl::Span<const uint8_t> bytes);
  // Sends `part_` as the next part (starting the upload first).
  absl::Status SendPart();
  // The first error of a part sent, once every part in flight is done.
  absl::Status AwaitParts() ABSL_LOCKS_EXCLUDED(mu_);
  void Abort();

  S3Client* const client_;
  const std::string path_, bucket_, key_;
  const uint64_t part_bytes_;
  const int concurrency_;
  uint64_t written_ = 0;
  // Bytes not sent yet; parts' buffers are used again once sent (no fresh
  // pages per part).
  std::shared_ptr<std::vector<uint8_t>> part_;
  std::string upload_id_;  // empty until a first part is sent
  absl::Status failed_;    // the first error; every later call returns it
  bool closed_ = false;
  std::unique_ptr<ThreadPool> pool_;
  absl::Mutex mu_;
  std::vector<UploadedPart> parts_ ABSL_GUARDED_BY(mu_);  // part i + 1's
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status part_error_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<std::vector<uint8_t>>> spare_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_S3_UPLOAD_H_
