// `ckpt-bench recovery`: the time a job takes to come back from a lost node
// (detection, rendezvous, restore from peer replicas), against a plain TCP
// copy of the same bytes (ckpt_bench_recovery.cc).
#ifndef CKPT_TOOLS_CKPT_BENCH_RECOVERY_H_
#define CKPT_TOOLS_CKPT_BENCH_RECOVERY_H_

#include <cstdint>
#include <string>

int RunRecovery(const std::string& dir, uint64_t state_mib, bool json);

#endif  // CKPT_TOOLS_CKPT_BENCH_RECOVERY_H_
