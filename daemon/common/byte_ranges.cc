#include "daemon/common/byte_ranges.h"

#include <algorithm>

namespace ckpt::daemon {

void ByteRanges::Add(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  // The first range that ends at or after `begin` (it may touch it).
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second >= begin) --it;
  while (it != ranges_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ranges_.erase(it);
  }
  ranges_.emplace(begin, end);
}

void ByteRanges::Remove(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second > begin) --it;
  std::vector<Range> kept;
  while (it != ranges_.end() && it->first < end) {
    if (it->first < begin) kept.emplace_back(it->first, begin);
    if (it->second > end) kept.emplace_back(end, it->second);
    it = ranges_.erase(it);
  }
  for (const Range& r : kept) ranges_.emplace(r.first, r.second);
}

std::vector<ByteRanges::Range> ByteRanges::Missing(uint64_t begin,
                                                   uint64_t end) const {
  std::vector<Range> missing;
  auto it = ranges_.upper_bound(begin);
  if (it != ranges_.begin() && std::prev(it)->second > begin) --it;
  uint64_t at = begin;
  for (; it != ranges_.end() && it->first < end && at < end; ++it) {
    if (it->first > at) missing.emplace_back(at, it->first);
    at = std::max(at, it->second);
  }
  if (at < end) missing.emplace_back(at, end);
  return missing;
}

uint64_t ByteRanges::bytes() const {
  uint64_t n = 0;
  for (const auto& [begin, end] : ranges_) n += end - begin;
  return n;
}

}  // namespace ckpt::daemon
