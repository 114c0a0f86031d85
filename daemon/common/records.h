// Small helpers shared by the daemon's stores: parsing a stored protobuf record
// (with an error that names its key) and the wall-clock timestamps records
// carry.
//
// Thread-safety: pure functions, callable from any thread.
#ifndef CKPT_DAEMON_COMMON_RECORDS_H_
#define CKPT_DAEMON_COMMON_RECORDS_H_

#include <chrono>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ckpt::daemon {

template <typename Message>
absl::StatusOr<Message> ParseRecord(const std::string& key,
                                    const std::string& bytes) {
  Message m;
  if (!m.ParseFromString(bytes)) {
    return absl::DataLossError(absl::StrCat("record ", key, " does not parse"));
  }
  return m;
}

inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_COMMON_RECORDS_H_
