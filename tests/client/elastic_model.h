// The toy model of the many-node elastic test: a global float32 vector whose
// update is elementwise and deterministic, so the state after N iterations
// does not depend on how it was sharded or where training restarted.
#ifndef CKPT_TESTS_CLIENT_ELASTIC_MODEL_H_
#define CKPT_TESTS_CLIENT_ELASTIC_MODEL_H_

#include <cstdint>
#include <utility>

namespace ckpt::testing {

inline float ElasticInitial(int64_t g) {
  return static_cast<float>(g % 1000) * 0.001f;
}

inline float ElasticStep(float x, uint64_t iteration, int64_t g) {
  const float push = static_cast<float>((iteration * 7 + g * 13) % 101) * 0.01f;
  return x * 0.99f + push;
}

// Rank `rank`'s box [offset, offset + length) of a vector of `global` among
// `world` ranks (uneven when `world` does not divide it).
inline std::pair<int64_t, int64_t> ElasticBox(int64_t global, uint32_t rank,
                                              uint32_t world) {
  const int64_t begin = global * rank / world;
  const int64_t end = global * (rank + 1) / world;
  return {begin, end - begin};
}

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_CLIENT_ELASTIC_MODEL_H_
