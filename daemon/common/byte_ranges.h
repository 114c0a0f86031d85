// ByteRanges: a set of byte ranges [begin, end) of one file, kept merged:
// which parts of a copy being landed are there, and which are on their way.
//
// Thread-safety: none; its owner's lock guards it.
#ifndef CKPT_DAEMON_COMMON_BYTE_RANGES_H_
#define CKPT_DAEMON_COMMON_BYTE_RANGES_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace ckpt::daemon {

class ByteRanges {
 public:
  using Range = std::pair<uint64_t, uint64_t>;  // [first, second)

  // Adds [begin, end), merged with the ranges it touches.
  void Add(uint64_t begin, uint64_t end);
  // Removes [begin, end) (parts of ranges outside it stay).
  void Remove(uint64_t begin, uint64_t end);
  // The parts of [begin, end) the set lacks, in order.
  std::vector<Range> Missing(uint64_t begin, uint64_t end) const;
  bool Covers(uint64_t begin, uint64_t end) const {
    return Missing(begin, end).empty();
  }
  // Bytes in the set.
  uint64_t bytes() const;
  bool empty() const { return ranges_.empty(); }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end, disjoint, not touching
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_BYTE_RANGES_H_
