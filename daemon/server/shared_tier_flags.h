// ckptd's flags of tier T3, the shared tier: a directory every node mounts
// or an object store with S3's API, and the object store's endpoint,
// addressing, credentials and transfers.
#ifndef CKPT_DAEMON_SERVER_SHARED_TIER_FLAGS_H_
#define CKPT_DAEMON_SERVER_SHARED_TIER_FLAGS_H_

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "daemon/peer/shared_tier.h"
#include "daemon/server/ckptd_flags.h"

namespace ckpt::daemon {

void AddSharedTierOptions(CLI::App& app, CkptdFlags& f);
// The shared tier's options from the flags; InvalidArgument naming flags that
// contradict each other.
absl::Status ApplySharedTierFlags(const CkptdFlags& f, SharedTierOptions* out);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_SHARED_TIER_FLAGS_H_
