// Building blocks of EtcdCoordinator's transactions (etcd_coordinator.cc,
// etcd_coordinator_steps.cc): key ranges, compares, puts, and the one
// conversion of etcd's gRPC statuses. Internal to the daemon.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_DAEMON_COORD_ETCD_OPS_H_
#define CKPT_DAEMON_COORD_ETCD_OPS_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "proto/etcd.pb.h"

namespace ckpt::daemon::etcd_ops {

using etcdserverpb::Compare;

inline constexpr int kAttempts =
    20;  // transactions retried after losing a race

// The key range of every key that starts with `prefix`.
inline std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');
}

// The one conversion of etcd's gRPC statuses (the codes are the same numbers).
inline absl::Status EtcdError(const grpc::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat(what, ": etcd: ", s.error_message()));
}

inline Compare CreatedNever(const std::string& key) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::CREATE);
  c.set_result(Compare::EQUAL);
  c.set_create_revision(0);
  return c;
}

inline Compare ModifiedAt(const std::string& key, int64_t revision) {
  Compare c;
  c.set_key(key);
  c.set_target(Compare::MOD);
  c.set_result(Compare::EQUAL);
  c.set_mod_revision(revision);
  return c;
}

inline etcdserverpb::RequestOp PutOp(const std::string& key,
                                     std::string value) {
  etcdserverpb::RequestOp op;
  op.mutable_request_put()->set_key(key);
  op.mutable_request_put()->set_value(std::move(value));
  return op;
}

}  // namespace ckpt::daemon::etcd_ops

#endif  // CKPT_DAEMON_COORD_ETCD_OPS_H_
