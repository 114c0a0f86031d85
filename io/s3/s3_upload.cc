#include "io/s3/s3_upload.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/logging.h"

namespace ckpt::io::s3 {

S3Upload::S3Upload(S3Client* client, std::string path, std::string bucket,
                   std::string key, uint64_t part_bytes, int concurrency)
    : client_(client),
      path_(std::move(path)),
      bucket_(std::move(bucket)),
      key_(std::move(key)),
      part_bytes_(part_bytes),
      concurrency_(std::max(1, concurrency)),
      part_(std::make_shared<std::vector<uint8_t>>()) {}

S3Upload::~S3Upload() {
  if (!closed_) Abort();
}

absl::Status S3Upload::Write(uint64_t offset, AlignedBuffer buffer) {
  return Append(offset, buffer.span());
}

absl::Status S3Upload::WriteBorrowed(uint64_t offset,
                                     absl::Span<const uint8_t> bytes) {
  return Append(offset, bytes);
}

absl::Status S3Upload::Append(uint64_t offset,
                              absl::Span<const uint8_t> bytes) {
  if (!failed_.ok()) return failed_;
  if (closed_) {
    return absl::FailedPreconditionError(path_ + ": written after Close");
  }
  if (offset != written_) {
    return failed_ = absl::UnimplementedError(absl::StrCat(
               path_, ": an object is written in order; a write at ", offset,
               " came after ", written_, " bytes"));
  }
  written_ += bytes.size();
  while (!bytes.empty()) {
    const size_t n =
        std::min<size_t>(bytes.size(), part_bytes_ - part_->size());
    part_->insert(part_->end(), bytes.begin(), bytes.begin() + n);
    bytes.remove_prefix(n);
    if (part_->size() == part_bytes_) {
      if (absl::Status s = SendPart(); !s.ok()) return failed_ = s;
    }
  }
  return absl::OkStatus();
}

absl::Status S3Upload::SendPart() {
  if (upload_id_.empty()) {
    absl::StatusOr<std::string> id =
        client_->CreateMultipartUpload(bucket_, key_);
    if (!id.ok()) return id.status();
    upload_id_ = *id;
    pool_ = std::make_unique<ThreadPool>(concurrency_);
  }
  int number;
  {
    absl::MutexLock lock(&mu_);
    auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return in_flight_ < concurrency_;
    };
    mu_.Await(absl::Condition(&room));
    if (!part_error_.ok()) return part_error_;
    parts_.emplace_back();
    number = static_cast<int>(parts_.size());
    ++in_flight_;
  }
  std::shared_ptr<std::vector<uint8_t>> bytes = std::move(part_);
  {
    absl::MutexLock lock(&mu_);
    if (!spare_.empty()) {
      part_ = std::move(spare_.back());
      spare_.pop_back();
    }
  }
  if (part_ == nullptr) {
    part_ = std::make_shared<std::vector<uint8_t>>();
    part_->reserve(part_bytes_);
  }
  part_->clear();
  pool_->Schedule([this, bytes, number] {
    absl::StatusOr<UploadedPart> part =
        client_->UploadPart(bucket_, key_, upload_id_, number, *bytes);
    absl::MutexLock lock(&mu_);
    if (part.ok()) {
      parts_[number - 1] = *std::move(part);
    } else if (part_error_.ok()) {
      part_error_ = part.status();
    }
    spare_.push_back(bytes);
    --in_flight_;
  });
  return absl::OkStatus();
}

absl::Status S3Upload::AwaitParts() {
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return in_flight_ == 0;
  };
  mu_.Await(absl::Condition(&idle));
  return part_error_;
}

absl::Status S3Upload::Flush() {
  if (!failed_.ok()) return failed_;
  if (absl::Status s = AwaitParts(); !s.ok()) return failed_ = s;
  return absl::OkStatus();
}

absl::Status S3Upload::Allocate(uint64_t) { return absl::OkStatus(); }

absl::Status S3Upload::Truncate(uint64_t size) {
  if (size == written_) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      path_, ": an object being uploaded cannot be cut to ", size, " bytes"));
}

absl::Status S3Upload::Close() {
  if (closed_) return failed_;
  absl::Status s = failed_;
  if (s.ok() && upload_id_.empty()) {
    // It all fits in one part: one request.
    s = client_->PutObject(bucket_, key_, *part_);
  } else if (s.ok()) {
    if (!part_->empty()) s = SendPart();
    absl::Status parts = AwaitParts();
    if (s.ok()) s = parts;
    if (s.ok()) {
      std::vector<UploadedPart> parts;
      {
        absl::MutexLock lock(&mu_);
        parts = parts_;
      }
      s = client_->CompleteMultipartUpload(bucket_, key_, upload_id_, parts);
    }
  }
  if (!s.ok()) {
    failed_ = s;
    Abort();
  }
  closed_ = true;
  pool_.reset();
  part_ = std::make_shared<std::vector<uint8_t>>();
  absl::MutexLock lock(&mu_);
  spare_.clear();
  return s;
}

void S3Upload::Abort() {
  if (pool_ != nullptr) {
    (void)AwaitParts();
    pool_.reset();
  }
  closed_ = true;
  if (upload_id_.empty()) return;
  absl::Status aborted =
      client_->AbortMultipartUpload(bucket_, key_, upload_id_);
  if (!aborted.ok()) {
    CKPT_LOG_WARN("{}: the upload left behind could not be aborted: {}", path_,
                  aborted.ToString());
  }
  upload_id_.clear();
}

}  // namespace ckpt::io::s3
