#include "daemon/publish/arrival.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "io/sync_readable_file.h"

namespace ckpt::daemon {

// A peer's view of one rank's file from an offset on, as it arrives.
class Arrival::Reader : public io::SyncReadableFile {
 public:
  Reader(std::shared_ptr<Arrival> arrival, uint32_t rank, uint64_t offset,
         absl::Duration stall)
      : arrival_(std::move(arrival)),
        rank_(rank),
        offset_(offset),
        stall_(stall),
        generation_(arrival_->GenerationOf(rank)),
        path_(arrival_->PathOf(rank)) {}

  absl::Status Read(uint64_t offset, absl::Span<uint8_t> dst) override {
    const uint64_t size = arrival_->SizeOf(rank_) - offset_;
    if (offset > size || dst.size() > size - offset) {
      return absl::OutOfRangeError(absl::StrCat(
          "read of ", dst.size(), " bytes at ", offset, " past the end of ",
          path_, " (", size, " bytes from ", offset_, ")"));
    }
    const uint64_t at = offset_ + offset;
    RETURN_IF_ERROR(
        arrival_->WaitFor(rank_, at + dst.size(), generation_, stall_));
    std::memcpy(dst.data(), arrival_->files_[rank_]->data() + at, dst.size());
    // Bytes found bad meanwhile must not go out as good ones.
    return arrival_->WaitFor(rank_, at + dst.size(), generation_,
                             absl::ZeroDuration());
  }
  absl::StatusOr<uint64_t> Size() override {
    return arrival_->SizeOf(rank_) - offset_;
  }
  const std::string& path() const override { return path_; }

 private:
  const std::shared_ptr<Arrival> arrival_;  // keeps the mapping
  const uint32_t rank_;
  const uint64_t offset_;
  const absl::Duration stall_;
  const uint64_t generation_;
  const std::string path_;
};

absl::StatusOr<std::shared_ptr<Arrival>> Arrival::Create(
    io::FileSystem* fs, proto::VersionRecord record, std::string dir) {
  if (record.files_size() != static_cast<int>(record.world_size())) {
    return absl::DataLossError(absl::StrCat(
        "version ", record.version(), " of topic ", record.topic(), " lists ",
        record.files_size(), " files for ", record.world_size(), " ranks"));
  }
  RETURN_IF_ERROR(fs->CreatePrivateDirs(dir));
  std::shared_ptr<Arrival> arrival(
      new Arrival(std::move(record), std::move(dir)));
  const proto::VersionRecord& r = arrival->record_;
  for (uint32_t rank = 0; rank < r.world_size(); ++rank) {
    if (r.files(rank).rank() != rank || r.files(rank).file_bytes() == 0) {
      return absl::DataLossError(absl::StrCat(
          "version ", r.version(), " of topic ", r.topic(), ": its file ", rank,
          " is not rank ", rank, "'s, or is empty"));
    }
    io::MapOptions options;
    options.create_size = r.files(rank).file_bytes();
    ASSIGN_OR_RETURN(std::unique_ptr<io::MappedFile> file,
                     fs->MapFile(arrival->PathOf(rank), options));
    arrival->files_.push_back(std::move(file));
  }
  absl::MutexLock lock(&arrival->mu_);
  arrival->arrived_.assign(r.world_size(), 0);
  arrival->generation_.assign(r.world_size(), 0);
  return arrival;
}

std::string Arrival::PathOf(uint32_t rank) const {
  return io::JoinPath(dir_, absl::StrCat("rank-", rank, ".shard"));
}

uint64_t Arrival::SizeOf(uint32_t rank) const {
  return record_.files(static_cast<int>(rank)).file_bytes();
}

absl::Span<const uint8_t> Arrival::Bytes(uint32_t rank) const {
  return {files_[rank]->data(), files_[rank]->size()};
}

absl::Span<uint8_t> Arrival::Space(uint32_t rank, uint64_t from) {
  io::MappedFile& file = *files_[rank];
  from = std::min<uint64_t>(from, file.size());
  return {file.data() + from, file.size() - from};
}

void Arrival::Arrived(uint32_t rank, uint64_t end) {
  absl::MutexLock lock(&mu_);
  arrived_[rank] = std::max(arrived_[rank], std::min(end, SizeOf(rank)));
}

uint64_t Arrival::ArrivedOf(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return arrived_[rank];
}

void Arrival::Restart(uint32_t rank) {
  absl::MutexLock lock(&mu_);
  arrived_[rank] = 0;
  ++generation_[rank];
}

void Arrival::Finish(absl::Status why) {
  absl::MutexLock lock(&mu_);
  finished_ = true;
  failed_ = std::move(why);
}

uint64_t Arrival::GenerationOf(uint32_t rank) const {
  absl::MutexLock lock(&mu_);
  return generation_[rank];
}

absl::Status Arrival::WaitFor(uint32_t rank, uint64_t end, uint64_t generation,
                              absl::Duration stall) {
  const std::string what =
      absl::StrCat("version ", record_.version(), " of topic ", record_.topic(),
                   ", rank ", rank, "'s file");
  absl::MutexLock lock(&mu_);
  const uint64_t before = arrived_[rank];
  auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return arrived_[rank] >= end || generation_[rank] != generation ||
           !failed_.ok() || (finished_ && failed_.ok());
  };
  mu_.AwaitWithTimeout(absl::Condition(&ready), stall);
  if (generation_[rank] != generation) {
    return absl::DataLossError(absl::StrCat(
        what, ": bytes sent from it were bad and are being fetched again"));
  }
  if (!failed_.ok()) {
    return absl::Status(failed_.code(),
                        absl::StrCat(what, ": ", failed_.message()));
  }
  if (arrived_[rank] >= end || finished_) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      what, ": nothing arrived here for ", absl::FormatDuration(stall), " (",
      before, " of ", SizeOf(rank), " bytes)"));
}

std::function<absl::Status(uint64_t)> Arrival::Waiter(uint32_t rank,
                                                      absl::Duration stall) {
  return [self = shared_from_this(), rank, stall,
          generation = GenerationOf(rank)](uint64_t end) {
    return self->WaitFor(rank, end, generation, stall);
  };
}

absl::StatusOr<std::unique_ptr<io::ReadableFile>> Arrival::ReaderFrom(
    uint32_t rank, uint64_t offset, absl::Duration stall) {
  if (rank >= record_.world_size()) {
    return absl::NotFoundError(absl::StrCat("version ", record_.version(),
                                            " of topic ", record_.topic(),
                                            " has no rank ", rank));
  }
  if (offset > SizeOf(rank)) {
    return absl::OutOfRangeError(
        absl::StrCat("offset ", offset, " is past the end of rank ", rank,
                     "'s file (", SizeOf(rank), " bytes)"));
  }
  return std::unique_ptr<io::ReadableFile>(
      new Reader(shared_from_this(), rank, offset, stall));
}

}  // namespace ckpt::daemon
