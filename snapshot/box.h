// Box math for sharded tensors. A box is the part of a tensor's global shape
// that one shard holds: an offset and a length per dimension, its elements
// stored row-major. CopyBoxIntersection moves the elements two boxes have in
// common from one buffer to the other; it is what assembling a full tensor
// (`ckpt export`) and restoring onto a different number of ranks are built on.
//
// Thread-safety: stateless functions.
#ifndef CKPT_SNAPSHOT_BOX_H_
#define CKPT_SNAPSHOT_BOX_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace ckpt::snapshot {

struct Box {
  std::vector<int64_t> offset;
  std::vector<int64_t> length;

  // Elements in the box; 1 for a scalar (no dimensions).
  int64_t elements() const;
};

// The box the two have in common; empty (some length 0) when they do not
// overlap. Both must have the same number of dimensions.
Box Intersect(const Box& a, const Box& b);

// Copies the elements in the intersection of `src_box` and `dst_box` from
// `src` (laid out over src_box) to `dst` (laid out over dst_box). Returns the
// number of elements copied. The spans must hold exactly their box's elements
// of `element_size` bytes each (checked by the caller, e.g. with
// ValidateTensorBox).
int64_t CopyBoxIntersection(absl::Span<const uint8_t> src, const Box& src_box,
                            absl::Span<uint8_t> dst, const Box& dst_box,
                            size_t element_size);

// A part of a box whose elements are contiguous in the box's row-major layout,
// starting at element `first` of it.
struct Slab {
  Box box;
  int64_t first = 0;
};

// Cuts `box` into slabs of at most `max_elements` elements (at least 1) each,
// in layout order: ranges along one dimension with every later dimension
// whole, as few as that allows. A box of no elements has no slabs; a scalar
// is one.
std::vector<Slab> ContiguousSlabs(const Box& box, int64_t max_elements);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_BOX_H_
