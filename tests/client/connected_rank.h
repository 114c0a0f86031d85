// How the client tests set up a rank: a Checkpointer connected to a ckptd and
// the state most tests save registered with it — one float tensor (a box of
// a global vector) and, when asked, the byte item "rng".
#ifndef CKPT_TESTS_CLIENT_CONNECTED_RANK_H_
#define CKPT_TESTS_CLIENT_CONNECTED_RANK_H_

#include <cstdint>
#include <memory>
#include <string>

#include "client/checkpointer.h"
#include "gtest/gtest.h"

namespace ckpt::client {

// What a test rank registers: `length` floats at `w`, elements [offset,
// offset + length) of a global vector of `global`, as `tensor`; and `rng`
// as "rng" when it is not null.
struct RankState {
  float* w = nullptr;
  int64_t global = 0;
  int64_t offset = 0;
  int64_t length = 0;
  std::string* rng = nullptr;
  std::string tensor = "model/w";
};

// Connects and registers `state`; null, with the failure recorded in the
// running test, when either fails.
inline std::unique_ptr<Checkpointer> ConnectRank(
    const CheckpointerOptions& options, const RankState& state) {
  absl::StatusOr<std::unique_ptr<Checkpointer>> c =
      Checkpointer::Connect(options);
  EXPECT_TRUE(c.ok()) << c.status();
  if (!c.ok()) return nullptr;
  absl::Status registered =
      (*c)->RegisterTensor(state.tensor, proto::DTYPE_FLOAT32, state.w,
                           {state.global}, {state.offset}, {state.length});
  EXPECT_TRUE(registered.ok()) << registered;
  if (state.rng != nullptr) {
    registered = (*c)->RegisterBytes("rng", state.rng);
    EXPECT_TRUE(registered.ok()) << registered;
  }
  return registered.ok() ? *std::move(c) : nullptr;
}

}  // namespace ckpt::client

#endif  // CKPT_TESTS_CLIENT_CONNECTED_RANK_H_
