#include "snapshot/box.h"

#include <algorithm>
#include <cstring>

namespace ckpt::snapshot {

int64_t Box::elements() const {
  int64_t n = 1;
  for (int64_t l : length) n *= l;
  return n;
}

Box Intersect(const Box& a, const Box& b) {
  Box out;
  const size_t dims = a.offset.size();
  out.offset.resize(dims);
  out.length.resize(dims);
  for (size_t d = 0; d < dims; ++d) {
    const int64_t lo = std::max(a.offset[d], b.offset[d]);
    const int64_t hi =
        std::min(a.offset[d] + a.length[d], b.offset[d] + b.length[d]);
    out.offset[d] = lo;
    out.length[d] = std::max<int64_t>(0, hi - lo);
  }
  return out;
}

int64_t CopyBoxIntersection(absl::Span<const uint8_t> src, const Box& src_box,
                            absl::Span<uint8_t> dst, const Box& dst_box,
                            size_t element_size) {
  const Box common = Intersect(src_box, dst_box);
  const int64_t total = common.elements();
  if (total == 0) return 0;
  const size_t dims = common.offset.size();
  if (dims == 0) {  // scalars
    std::memcpy(dst.data(), src.data(), element_size);
    return 1;
  }
  // Row-major strides (in elements) of both layouts.
  std::vector<int64_t> src_stride(dims), dst_stride(dims);
  src_stride[dims - 1] = dst_stride[dims - 1] = 1;
  for (size_t d = dims - 1; d > 0; --d) {
    src_stride[d - 1] = src_stride[d] * src_box.length[d];
    dst_stride[d - 1] = dst_stride[d] * dst_box.length[d];
  }
  // Trailing dimensions that the intersection covers whole in both layouts
  // are contiguous in both: copy them as one run.
  size_t outer = dims - 1;  // dimensions [0, outer) are iterated
  int64_t run = common.length[dims - 1];
  while (outer > 0 && common.length[outer] == src_box.length[outer] &&
         common.length[outer] == dst_box.length[outer]) {
    --outer;
    run *= common.length[outer];
  }
  std::vector<int64_t> index(outer, 0);  // position within common, per dim
  const size_t run_bytes = static_cast<size_t>(run) * element_size;
  for (int64_t done = 0; done < total; done += run) {
    int64_t s = 0, t = 0;
    for (size_t d = 0; d < dims; ++d) {
      const int64_t at = common.offset[d] + (d < outer ? index[d] : 0);
      s += (at - src_box.offset[d]) * src_stride[d];
      t += (at - dst_box.offset[d]) * dst_stride[d];
    }
    std::memcpy(dst.data() + t * element_size, src.data() + s * element_size,
                run_bytes);
    for (size_t d = outer; d-- > 0;) {  // odometer over the outer dims
      if (++index[d] < common.length[d]) break;
      index[d] = 0;
    }
  }
  return total;
}

std::vector<Slab> ContiguousSlabs(const Box& box, int64_t max_elements) {
  std::vector<Slab> out;
  if (box.elements() == 0) return out;
  max_elements = std::max<int64_t>(1, max_elements);
  const size_t dims = box.length.size();
  if (dims == 0 || box.elements() <= max_elements) {
    out.push_back({box, 0});
    return out;
  }
  // The outermost dimension `cut` whose every later dimension fits whole:
  // slabs take `rows` of it at a time, one index of each earlier dimension.
  std::vector<int64_t> inner(dims, 1);  // elements per index of dimension d
  for (size_t d = dims - 1; d > 0; --d) inner[d - 1] = inner[d] * box.length[d];
  size_t cut = 0;
  while (inner[cut] > max_elements) ++cut;
  const int64_t rows = std::max<int64_t>(1, max_elements / inner[cut]);
  int64_t outer = 1;
  for (size_t d = 0; d < cut; ++d) outer *= box.length[d];
  for (int64_t o = 0; o < outer; ++o) {
    Slab slab{box, 0};
    int64_t rest = o;
    for (size_t d = cut; d-- > 0;) {  // o's index in each earlier dimension
      slab.box.offset[d] = box.offset[d] + rest % box.length[d];
      slab.box.length[d] = 1;
      rest /= box.length[d];
    }
    for (int64_t a = 0; a < box.length[cut]; a += rows) {
      slab.box.offset[cut] = box.offset[cut] + a;
      slab.box.length[cut] = std::min(rows, box.length[cut] - a);
      slab.first = (o * box.length[cut] + a) * inner[cut];
      out.push_back(slab);
    }
  }
  return out;
}

}  // namespace ckpt::snapshot
