// SlotId names one rank's shard of one step inside ckptd: the staging slot
// that holds it in the memory tier, and the shard the persist pipeline,
// retention and the health figures speak of.
//
// Thread-safety: a value type.
#ifndef CKPT_DAEMON_COMMON_SLOT_ID_H_
#define CKPT_DAEMON_COMMON_SLOT_ID_H_

#include <cstdint>
#include <string>
#include <tuple>

namespace ckpt::daemon {

struct SlotId {
  std::string job;
  uint64_t step = 0;
  uint32_t rank = 0;
  bool operator<(const SlotId& o) const {
    return std::tie(job, step, rank) < std::tie(o.job, o.step, o.rank);
  }
  bool operator==(const SlotId& o) const {
    return std::tie(job, step, rank) == std::tie(o.job, o.step, o.rank);
  }
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_SLOT_ID_H_
