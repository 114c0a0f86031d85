// The demo's toy model: a deterministic, elementwise update of weights and a
// momentum buffer beside a frozen embedding (as in fine-tuning: it never
// changes, so incremental saves leave it where the last full save stored it),
// so the state after step T is the same however often training was interrupted
// and resumed (and however it is sharded), and a reference can be computed in
// one process.
//
// Thread-safety: a model is used by one thread at a time.
#ifndef CKPT_TOOLS_DEMO_MODEL_H_
#define CKPT_TOOLS_DEMO_MODEL_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ckpt::demo {

struct RankModel {
  int64_t offset = 0;  // this rank's first global element
  std::vector<float> w, m;
  std::vector<float> embed;  // frozen
  uint64_t rng = 0;  // stands for the trainer's RNG / data-loader position

  RankModel(uint32_t rank, int64_t elements)
      : offset(rank * elements), w(elements), m(elements), embed(elements) {
    for (int64_t i = 0; i < elements; ++i) {
      w[i] = static_cast<float>((offset + i) % 101) * 0.01f;
      embed[i] = static_cast<float>((offset + i) % 89) * 0.125f - 5.0f;
    }
    rng = 0x9e3779b97f4a7c15ull ^ rank;
  }

  void Step(uint64_t step) {
    const float bias = static_cast<float>(step % 13) * 1e-4f;
    for (size_t i = 0; i < w.size(); ++i) {
      float target =
          static_cast<float>((offset + static_cast<int64_t>(i)) % 977) * 1e-3f;
      float grad = w[i] * 0.01f - target + bias;
      m[i] = 0.9f * m[i] + 0.1f * grad;
      w[i] -= 0.01f * m[i];
    }
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  }

  std::string RngBytes() const {
    return std::string(reinterpret_cast<const char*>(&rng), 8);
  }
  bool SetRng(const std::string& bytes) {
    if (bytes.size() != 8) return false;
    std::memcpy(&rng, bytes.data(), 8);
    return true;
  }
  // Everything, for bit-for-bit comparison.
  std::string Serialize() const {
    std::string out(reinterpret_cast<const char*>(w.data()), w.size() * 4);
    out.append(reinterpret_cast<const char*>(m.data()), m.size() * 4);
    out.append(reinterpret_cast<const char*>(embed.data()), embed.size() * 4);
    out += RngBytes();
    return out;
  }
};

// A digest of a serialized state (FNV-1a), for logs: a trainer prints the
// digest of the state it resumed with, and ckpt-chaos compares it with its
// reference's to find a restore that returned other bytes than were saved.
inline uint64_t Digest(const std::string& state) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : state) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace ckpt::demo

#endif  // CKPT_TOOLS_DEMO_MODEL_H_
