// What a restore works on, shared by the Checkpointer and the collaborators
// its restores run through (Resharder, the slot checks): the registered
// items it fills, the connection to ckptd, the device, and the figures it
// reports to ckptd when it succeeds. Not for use outside client/.
//
// Thread-safety: a RestoreContext is used by the one thread calling
// Checkpointer::Restore.
#ifndef CKPT_CLIENT_RESTORE_CONTEXT_H_
#define CKPT_CLIENT_RESTORE_CONTEXT_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "proto/manifest.pb.h"

namespace ckpt::kernels {
class Device;
}  // namespace ckpt::kernels

namespace ckpt::client {

struct CheckpointerOptions;
class CheckpointerRpc;

// A tensor or byte item registered with a Checkpointer: saved from, and
// restored into, the trainer's memory.
struct RegisteredItem {
  proto::Item item;
  void* tensor = nullptr;        // tensors (null for an empty one)
  std::string* bytes = nullptr;  // byte items
  bool rank_local = false;       // Checkpointer::MarkRankLocal
  bool is_tensor() const { return bytes == nullptr; }
};

// What the restore in progress read, by source, reported to ckptd when it
// succeeds (its metrics).
struct RestoreReport {
  uint64_t memory_bytes = 0, disk_bytes = 0, peer_bytes = 0;
  uint32_t mismatches = 0, fallbacks = 0;
};

// Saved replicas a restore must not read, as (item name, saved rank): those
// outside the majority of a suspect step's replicas.
using ReplicasAvoided = std::set<std::pair<std::string, uint32_t>>;

struct RestoreContext {
  const CheckpointerOptions& options;
  CheckpointerRpc& rpc;
  kernels::Device& device;
  std::vector<RegisteredItem>& items;
  RestoreReport& report;
};

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_RESTORE_CONTEXT_H_
