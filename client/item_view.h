// ItemView: one item's raw bytes in a shard file, mapped into one contiguous
// range of memory without a copy: each chunk stored in place (raw, page
// aligned in the file: what ckptd writes for published versions) is mapped
// at its raw offset, so the chunks' headers between them drop out. The
// mapping is private (copy-on-write): writing to it changes nothing in the
// file.
//
// The chunks are not checked here: ckptd verified every chunk of a version
// before placing it (client/subscriber.h).
//
// Thread-safety: immutable once made.
#ifndef CKPT_CLIENT_ITEM_VIEW_H_
#define CKPT_CLIENT_ITEM_VIEW_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "proto/manifest.pb.h"

namespace ckpt::client {

class ItemView {
 public:
  // Maps `item` of the shard file open at `fd` (named `path`, for errors;
  // the mapping outlives the descriptor). FailedPrecondition when a chunk of
  // it is not stored in place (compressed, filtered, small, or in a base
  // shard): read it instead.
  static absl::StatusOr<std::unique_ptr<ItemView>> Map(int fd,
                                                       const std::string& path,
                                                       const proto::Item& item);
  ~ItemView();
  ItemView(const ItemView&) = delete;
  ItemView& operator=(const ItemView&) = delete;

  absl::Span<uint8_t> bytes() const { return {base_, size_}; }

  // Whether every chunk of `item` is stored in place.
  static bool StoredInPlace(const proto::Item& item);
  // Copies `item` of the shard file open at `fd` into `out` (its raw size)
  // straight from the page cache, in pieces read by several threads
  // (CopyThreadsFor): for items StoredInPlace. Errors name `path`.
  static absl::Status ReadInPlace(int fd, const std::string& path,
                                  const proto::Item& item,
                                  absl::Span<uint8_t> out);

 private:
  ItemView(uint8_t* base, size_t size, size_t mapped)
      : base_(base), size_(size), mapped_(mapped) {}
  uint8_t* const base_;
  const size_t size_;
  const size_t mapped_;  // the reserved range, page-rounded
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_ITEM_VIEW_H_
