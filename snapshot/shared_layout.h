// The names in a shared tier's job folder (a directory, or an object store's
// prefix), and which of them retention drops. ckptd writes and collects the
// folder (daemon/peer/shared_tier.h); `ckpt ls/verify/export/gc` read and
// collect it directly. Three kinds of names:
//   "<step:020>-<rank:010>.ckpt"                a rank's copy of a step;
//   "<step:020>.commit"                         the step's commit marker,
//                                               written after every copy;
//   "<base:020>-<rank:010>.ckpt.base-of-<step:020>"
//                                               a pin: step's copy of that
//                                               rank stores chunks in base's.
#ifndef CKPT_SNAPSHOT_SHARED_LAYOUT_H_
#define CKPT_SNAPSHOT_SHARED_LAYOUT_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace ckpt::snapshot {

bool ParseCopyName(absl::string_view name, uint64_t* step, uint32_t* rank);
bool ParseMarkerName(absl::string_view name, uint64_t* step);
bool ParsePinName(absl::string_view name, uint64_t* base, uint32_t* rank,
                  uint64_t* step);
// The pin that `step`'s copy of `rank` stores chunks in `base`'s.
std::string PinName(uint64_t base, uint32_t rank, uint64_t step);

// What retention removes from a job folder that keeps the newest `keep`
// committed steps: the markers of older steps first (a step stops being
// visible before any of its copies goes), then their copies and pins, except
// the copies a kept copy reads chunks from (through chains of pins; a pin
// counts before its copy is there: another node may be writing that copy).
// Copies of steps newer than the oldest kept one stay, committed or not.
struct SharedRetention {
  uint64_t oldest_kept = 0;          // 0: nothing committed, nothing goes
  std::vector<std::string> markers;  // to remove first
  std::vector<std::string> copies;   // then these (copies and pins)
  std::set<uint64_t> dropped_steps;  // whose copies go
  std::set<uint64_t> pinned_steps;   // older steps kept as bases
};
SharedRetention PlanSharedRetention(const std::vector<std::string>& names,
                                    std::vector<uint64_t> committed,
                                    size_t keep);

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_SHARED_LAYOUT_H_
