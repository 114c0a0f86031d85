// How daemon messages name a shard: "job J step S rank R".
//
// Thread-safety: a pure function, callable from any thread.
#ifndef CKPT_DAEMON_COMMON_DESCRIBE_H_
#define CKPT_DAEMON_COMMON_DESCRIBE_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

inline std::string Describe(const std::string& job, uint64_t step,
                            uint32_t rank) {
  return absl::StrCat("job ", job, " step ", step, " rank ", rank);
}

// The same for any shard identifier with `job`, `step` and `rank` fields
// (SlotId, ReplicaStore::Key).
template <typename ShardId>
std::string Describe(const ShardId& id) {
  return Describe(id.job, id.step, id.rank);
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_DESCRIBE_H_
