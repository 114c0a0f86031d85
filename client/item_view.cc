#include "client/item_view.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/parallel_copy.h"
#include "io/errno_status.h"
#include "io/status_macros.h"
#include "snapshot/format.h"

namespace ckpt::client {
namespace {

// MADV_POPULATE_READ (Linux 5.14), which older headers lack.
constexpr int kPopulateRead = 22;

size_t PageRound(size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return (n + page - 1) / page * page;
}

// Whether the chunk's raw bytes lie, as they are, page aligned in the file.
bool InPlace(const proto::ChunkInfo& c) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  return c.base() == 0 && c.xor_base() == 0 && c.codec() == proto::CODEC_NONE &&
         c.filter() == proto::FILTER_NONE && c.raw_size() == c.stored_size() &&
         c.stored_offset() == snapshot::kAlignment &&
         (c.file_offset() + c.stored_offset()) % page == 0 &&
         c.raw_offset() % page == 0;
}

constexpr uint64_t kReadPiece = 8 << 20;

// Bytes of an item to read: `bytes` at `at` in the file into `dst`.
struct Piece {
  uint8_t* dst;
  uint64_t at;
  size_t bytes;
};

absl::Status ReadPiece(int fd, const std::string& path, const proto::Item& item,
                       Piece p) {
  while (p.bytes > 0) {
    const ssize_t n = ::pread(fd, p.dst, p.bytes, static_cast<off_t>(p.at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return n < 0 ? io::ErrnoToStatus(errno, "reading " + path)
                   : absl::DataLossError(absl::StrCat(
                         path, " ends inside item \"", item.name(), "\""));
    }
    p.dst += n;
    p.at += static_cast<uint64_t>(n);
    p.bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

}  // namespace

bool ItemView::StoredInPlace(const proto::Item& item) {
  for (const proto::ChunkInfo& c : item.chunks()) {
    if (!InPlace(c)) return false;
  }
  return true;
}

absl::Status ItemView::ReadInPlace(int fd, const std::string& path,
                                   const proto::Item& item,
                                   absl::Span<uint8_t> out) {
  if (out.size() != item.raw_size() || !StoredInPlace(item)) {
    return absl::InvalidArgumentError(
        absl::StrCat("item \"", item.name(), "\" of ", path,
                     " cannot be read in place into ", out.size(), " bytes"));
  }
  // Pieces of at most kReadPiece bytes, read by several threads: one core's
  // copy out of the page cache is well below what the memory bus gives.
  std::vector<Piece> pieces;
  for (const proto::ChunkInfo& c : item.chunks()) {
    for (uint64_t done = 0; done < c.raw_size(); done += kReadPiece) {
      pieces.push_back(
          {out.data() + c.raw_offset() + done,
           c.file_offset() + c.stored_offset() + done,
           static_cast<size_t>(std::min(kReadPiece, c.raw_size() - done))});
    }
  }
  std::vector<absl::Status> read(pieces.size());
  ParallelFor(pieces.size(), CopyThreadsFor(out.size()), [&](size_t i) {
    read[i] = ReadPiece(fd, path, item, pieces[i]);
  });
  for (absl::Status& s : read) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ItemView>> ItemView::Map(
    int fd, const std::string& path, const proto::Item& item) {
  if (!StoredInPlace(item)) {
    return absl::FailedPreconditionError(
        absl::StrCat("item \"", item.name(), "\" of ", path,
                     " has a chunk not stored in place: read it"));
  }
  const size_t size = static_cast<size_t>(item.raw_size());
  if (size == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("item \"", item.name(), "\" is empty"));
  }
  const size_t mapped = PageRound(size);
  void* reserved = ::mmap(nullptr, mapped, PROT_NONE,
                          MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (reserved == MAP_FAILED) {
    return io::ErrnoToStatus(errno, "reserving a view of " + item.name());
  }
  std::unique_ptr<ItemView> view(
      new ItemView(static_cast<uint8_t*>(reserved), size, mapped));
  for (const proto::ChunkInfo& c : item.chunks()) {
    void* at = view->base_ + c.raw_offset();
    void* got = ::mmap(at, PageRound(c.raw_size()), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_FIXED, fd,
                       static_cast<off_t>(c.file_offset() + c.stored_offset()));
    if (got == MAP_FAILED) {
      return io::ErrnoToStatus(
          errno, absl::StrCat("mapping item \"", item.name(), "\" of ", path));
    }
  }
  // Every page's fault taken now, in one pass, as a read: the pages stay
  // the file's (MAP_POPULATE would copy them, the mapping being private and
  // writable). Kernels before 5.14 lack it: the pages then fault as read.
  (void)::madvise(view->base_, mapped, kPopulateRead);
  return view;
}

ItemView::~ItemView() { ::munmap(base_, mapped_); }

}  // namespace ckpt::client
