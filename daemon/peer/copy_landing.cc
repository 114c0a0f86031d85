#include "daemon/peer/copy_landing.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "io/status_macros.h"
#include "snapshot/format.h"

namespace ckpt::daemon {
namespace {

// A claimed range is read and landed in pieces of this size, so that the
// readers waiting for its first bytes go on before its last ones are read.
constexpr uint64_t kPieceBytes = 64 << 20;

}  // namespace

CopyLanding::CopyLanding(snapshot::SelfContained view,
                         std::unique_ptr<io::MappedFile> file, std::string path)
    : path_(std::move(path)),
      size_(view.size),
      view_(std::move(view)),
      file_(std::move(file)) {}

absl::StatusOr<std::unique_ptr<CopyLanding>> CopyLanding::Start(
    io::FileSystem* store, const std::string& path, io::FileSystem* local,
    const std::string& local_path,
    const std::function<void(uint64_t size)>& reserve) {
  ASSIGN_OR_RETURN(snapshot::SelfContained view,
                   snapshot::OpenSelfContained(store, path));
  if (view.size < snapshot::kAlignment) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", view.size, " bytes, too short for a shard file"));
  }
  reserve(view.size);
  ASSIGN_OR_RETURN(
      std::unique_ptr<io::MappedFile> file,
      local->MapFile(local_path, {.create_size = view.size, .reserve = false}));
  std::unique_ptr<CopyLanding> landing(
      new CopyLanding(std::move(view), std::move(file), path));
  const uint64_t size = landing->size_;
  RETURN_IF_ERROR(
      landing->Ensure(size - snapshot::kAlignment, snapshot::kAlignment)
          .status());
  absl::StatusOr<snapshot::Footer> decoded = snapshot::DecodeFooter(
      absl::MakeConstSpan(landing->file_->data() + size - snapshot::kFooterSize,
                          snapshot::kFooterSize));
  if (!decoded.ok()) {
    return absl::Status(decoded.status().code(),
                        absl::StrCat(path, ": ", decoded.status().message()));
  }
  const snapshot::Footer& footer = *decoded;
  if (footer.manifest_offset >= size) {
    return absl::DataLossError(
        absl::StrCat(path, ": its footer places the ", "manifest at ",
                     footer.manifest_offset, ", past its end (", size, ")"));
  }
  RETURN_IF_ERROR(
      landing->Ensure(footer.manifest_offset, size - footer.manifest_offset)
          .status());
  return landing;
}

absl::StatusOr<uint64_t> CopyLanding::Ensure(uint64_t offset, uint64_t length) {
  if (offset > size_ || length > size_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes ", offset, " to ",
                                              offset + length, " of ", path_,
                                              ", a copy of ", size_, " bytes"));
  }
  const uint64_t end = offset + length;
  uint64_t read = 0;
  while (true) {
    std::vector<Range> mine;
    {
      absl::MutexLock lock(&mu_);
      auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return landed_.Covers(offset, end) || !Unclaimed(offset, end).empty();
      };
      mu_.Await(absl::Condition(&settled));
      if (landed_.Covers(offset, end)) return read;
      mine = Unclaimed(offset, end);
      for (const Range& r : mine) reading_.Add(r.first, r.second);
    }
    RETURN_IF_ERROR(Fetch(mine, &read));
  }
}

std::vector<CopyLanding::Range> CopyLanding::Unclaimed(uint64_t begin,
                                                       uint64_t end) const {
  std::vector<Range> unclaimed;
  for (const Range& m : landed_.Missing(begin, end)) {
    for (const Range& r : reading_.Missing(m.first, m.second)) {
      unclaimed.push_back(r);
    }
  }
  return unclaimed;
}

absl::Status CopyLanding::Fetch(const std::vector<Range>& ranges,
                                uint64_t* read) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    for (uint64_t at = ranges[i].first; at < ranges[i].second;) {
      const Range piece{at, std::min(ranges[i].second, at + kPieceBytes)};
      absl::Status s = Read(piece);
      absl::MutexLock lock(&mu_);
      if (!s.ok()) {
        // What this caller claimed and did not land goes back to whoever
        // asks next.
        reading_.Remove(at, ranges[i].second);
        for (size_t j = i + 1; j < ranges.size(); ++j) {
          reading_.Remove(ranges[j].first, ranges[j].second);
        }
        return s;
      }
      *read += piece.second - piece.first;
      reading_.Remove(piece.first, piece.second);
      landed_.Add(piece.first, piece.second);
      at = piece.second;
    }
  }
  return absl::OkStatus();
}

absl::Status CopyLanding::Read(const Range& range) {
  const absl::Span<uint8_t> dst(file_->data() + range.first,
                                range.second - range.first);
  RETURN_IF_ERROR(file_->Reserve(range.first, dst.size()));
  if (!view_.incremental) return view_.file->Read(range.first, dst);
  absl::MutexLock lock(&view_mu_);
  return view_.file->Read(range.first, dst);
}

bool CopyLanding::whole() const {
  absl::MutexLock lock(&mu_);
  return landed_.Covers(0, size_);
}

uint64_t CopyLanding::landed_bytes() const {
  absl::MutexLock lock(&mu_);
  return landed_.bytes();
}

}  // namespace ckpt::daemon
