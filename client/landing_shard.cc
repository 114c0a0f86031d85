#include "client/landing_shard.h"

#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/checkpointer_internal.h"
#include "io/file_system_wrapper.h"
#include "io/status_macros.h"
#include "io/threaded_readable_file.h"
#include "proto/daemon.grpc.pb.h"

namespace ckpt::client {
namespace {

// Reads in flight per landing file: a restore's window of 4 MiB chunks.
constexpr int kLandingReads = 16;
constexpr size_t kLandingWindowBytes = 64 << 20;
// Beyond the connection's timeout, for one range.
constexpr absl::Duration kLandingTimeout = absl::Minutes(5);

// The landed file, mapped; each read lands its range first.
class LandingFile final : public io::ThreadedReadableFile {
 public:
  LandingFile(CheckpointerRpc& rpc, const proto::ShardRecord& shard,
              std::unique_ptr<io::MappedFile> file)
      : ThreadedReadableFile(kLandingReads), rpc_(rpc), file_(std::move(file)) {
    request_.mutable_shard()->set_job(shard.job());
    request_.mutable_shard()->set_step(shard.step());
    request_.mutable_shard()->set_rank(shard.rank());
    request_.set_shard_path(shard.shard_path());
  }
  ~LandingFile() override { StopReads(); }

  absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
    if (offset > file_->size() || dst.size() > file_->size() - offset) {
      return absl::OutOfRangeError(
          absl::StrCat(path(), ": bytes ", offset, " to ", offset + dst.size(),
                       " of a file of ", file_->size()));
    }
    proto::LandRangeRequest request = request_;
    request.set_offset(offset);
    request.set_length(dst.size());
    proto::LandRangeResponse response;
    // ckptd retries a store that errs or stalls (capped backoff): a range
    // may take longer than a local call.
    RETURN_IF_ERROR(rpc_.Call(&proto::CkptDaemon::Stub::LandRange, request,
                              &response, "landing a range of the shard",
                              kLandingTimeout));
    std::memcpy(dst.data(), file_->data() + offset, dst.size());
    return absl::OkStatus();
  }
  absl::StatusOr<uint64_t> Size() override { return file_->size(); }
  const std::string& path() const override { return file_->path(); }

 private:
  CheckpointerRpc& rpc_;
  proto::LandRangeRequest request_;
  const std::unique_ptr<io::MappedFile> file_;
};

// The local file system, but the landing file is read through LandingFile.
class LandingFileSystem final : public io::FileSystemWrapper {
 public:
  LandingFileSystem(CheckpointerRpc& rpc, const proto::ShardRecord& shard)
      : FileSystemWrapper(io::DefaultFileSystem()), rpc_(rpc), shard_(shard) {}

  absl::StatusOr<std::unique_ptr<io::ReadableFile>> NewReadableFile(
      const std::string& path, const io::FileOptions& options) override {
    if (path != shard_.shard_path()) {
      return FileSystemWrapper::NewReadableFile(path, options);
    }
    ASSIGN_OR_RETURN(std::unique_ptr<io::MappedFile> file,
                     base()->MapFile(path, {.writable = false}));
    return std::unique_ptr<io::ReadableFile>(
        new LandingFile(rpc_, shard_, std::move(file)));
  }

 private:
  CheckpointerRpc& rpc_;
  const proto::ShardRecord shard_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> OpenShardReader(
    CheckpointerRpc& rpc, const proto::ShardRecord& shard) {
  if (!shard.lands_on_demand()) {
    return snapshot::ShardReader::Open(io::DefaultFileSystem(),
                                       shard.shard_path());
  }
  // The reader opens the file now and keeps it; a landed copy is
  // self-contained, so it never opens another (a base) through `fs`, which
  // need not outlive the call.
  LandingFileSystem fs(rpc, shard);
  snapshot::ShardReaderOptions options;
  options.read_window_bytes = kLandingWindowBytes;
  options.base_path = [&shard](uint64_t step) -> absl::StatusOr<std::string> {
    return absl::DataLossError(
        absl::StrCat(shard.shard_path(), " is a copy landed from the shared ",
                     "tier, self-contained, yet names base step ", step));
  };
  return snapshot::ShardReader::Open(&fs, shard.shard_path(), options);
}

}  // namespace ckpt::client
