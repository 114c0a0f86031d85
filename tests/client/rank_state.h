// The deterministic state of one trainer rank at a step, registered with a
// Checkpointer: a float32 tensor and a float64 "optimizer" tensor (the rank's
// boxes of global vectors) and an RNG byte item. Shared by the crash-test
// trainer process and the test that checks what it committed.
#ifndef CKPT_TESTS_CLIENT_RANK_STATE_H_
#define CKPT_TESTS_CLIENT_RANK_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "io/status_macros.h"

namespace ckpt::testing {

struct RankTensors {
  uint32_t rank, world;
  int64_t elements;
  std::vector<float> w;
  std::vector<double> m;
  std::string rng;

  RankTensors(uint32_t rank, uint32_t world, int64_t elements)
      : rank(rank),
        world(world),
        elements(elements),
        w(elements),
        m(elements / 2) {}

  absl::Status Register(client::Checkpointer* ckpt) {
    return Register(ckpt, w.data(), m.data());
  }
  // With the tensors at `w_data` and `m_data` instead (device memory that
  // mirrors w and m).
  absl::Status Register(client::Checkpointer* ckpt, void* w_data,
                        void* m_data) {
    const int64_t half = elements / 2;
    RETURN_IF_ERROR(ckpt->RegisterTensor("model/w", proto::DTYPE_FLOAT32,
                                         w_data, {elements * world},
                                         {elements * rank}, {elements}));
    RETURN_IF_ERROR(ckpt->RegisterTensor("optim/m", proto::DTYPE_FLOAT64,
                                         m_data, {half * world}, {half * rank},
                                         {half}));
    return ckpt->RegisterBytes("rng", &rng);
  }
  void Fill(uint64_t step) {
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>((step * 31 + i * 7 + rank) % 4093) * 0.25f;
    for (size_t i = 0; i < m.size(); ++i)
      m[i] = static_cast<double>((step * 17 + i + rank * 3) % 8191) * 0.125;
    rng = "rng-" + std::to_string(step) + "-" + std::to_string(rank);
  }
  // What differs from the state of `step` ("" when nothing does).
  std::string Mismatch(uint64_t step) const {
    RankTensors expected(rank, world, elements);
    expected.Fill(step);
    std::string out;
    for (size_t i = 0; i < w.size(); ++i) {
      if (w[i] != expected.w[i]) {
        out += "model/w[" + std::to_string(i) + "] ";
        break;
      }
    }
    for (size_t i = 0; i < m.size(); ++i) {
      if (m[i] != expected.m[i]) {
        out += "optim/m[" + std::to_string(i) + "] ";
        break;
      }
    }
    if (rng != expected.rng) out += "rng is \"" + rng + "\"";
    return out;
  }
  bool Matches(uint64_t step) const {
    RankTensors expected(rank, world, elements);
    expected.Fill(step);
    return w == expected.w && m == expected.m && rng == expected.rng;
  }
};

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CLIENT_RANK_STATE_H_
