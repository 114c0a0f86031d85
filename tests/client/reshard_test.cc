// Restore onto another number of ranks: N ranks save sharded tensors (1-D to
// 4-D, split along different dimensions, uneven and empty boxes, optimizer
// state, byte items) through a real ckptd; M ranks with new boxes restore the
// step from the memory tier (newest step) and from the shard files (an older
// one), and every element is compared with a single-process reference.
#include <chrono>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/test_util.h"

namespace ckpt {
namespace {

struct TensorSpec {
  std::string name;
  proto::DType dtype;
  size_t width;
  std::vector<int64_t> shape;
  size_t split_dim;
};

const std::vector<TensorSpec>& Specs() {
  static const auto* specs = new std::vector<TensorSpec>{
      {"model/a", proto::DTYPE_FLOAT32, 4, {37}, 0},
      {"model/b", proto::DTYPE_INT32, 4, {7, 5}, 1},
      {"model/c", proto::DTYPE_FLOAT64, 8, {4, 3, 6}, 0},
      {"model/d", proto::DTYPE_UINT8, 1, {2, 3, 2, 5}, 2},
      {"optim/a.exp_avg", proto::DTYPE_FLOAT32, 4, {37}, 0},
  };
  return *specs;
}

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

// Rank r of w holds [floor(r*e/w), floor((r+1)*e/w)) of the split dimension:
// uneven, and empty when there are more ranks than rows.
void BoxOf(const TensorSpec& t, uint32_t r, uint32_t w,
           std::vector<int64_t>* offset, std::vector<int64_t>* length) {
  *offset = std::vector<int64_t>(t.shape.size(), 0);
  *length = t.shape;
  const int64_t e = t.shape[t.split_dim];
  const int64_t lo = e * r / w, hi = e * (r + 1) / w;
  (*offset)[t.split_dim] = lo;
  (*length)[t.split_dim] = hi - lo;
}

// The box's elements of a row-major global tensor, element by element.
std::vector<uint8_t> Extract(const std::vector<uint8_t>& global,
                             const TensorSpec& t,
                             const std::vector<int64_t>& offset,
                             const std::vector<int64_t>& length) {
  std::vector<uint8_t> out;
  const int64_t n = Elements(length);
  for (int64_t i = 0; i < n; ++i) {
    int64_t rest = i, flat = 0, stride = 1;
    std::vector<int64_t> at(length.size());
    for (size_t d = length.size(); d-- > 0;) {
      at[d] = offset[d] + rest % length[d];
      rest /= length[d];
    }
    for (size_t d = length.size(); d-- > 0;) {
      flat += at[d] * stride;
      stride *= t.shape[d];
    }
    out.insert(out.end(), global.begin() + flat * t.width,
               global.begin() + (flat + 1) * t.width);
  }
  return out;
}

std::vector<std::vector<uint8_t>> GlobalState(uint64_t seed, uint64_t step) {
  std::mt19937_64 rng(seed * 31 + step);
  std::vector<std::vector<uint8_t>> out;
  for (const TensorSpec& t : Specs()) {
    std::vector<uint8_t> g(Elements(t.shape) * t.width);
    for (uint8_t& b : g) b = static_cast<uint8_t>(rng());
    out.push_back(std::move(g));
  }
  return out;
}

// One rank of a job: its checkpointer and the buffers it registered.
struct Rank {
  std::unique_ptr<client::Checkpointer> ckpt;
  std::vector<std::vector<uint8_t>> tensors;
  std::vector<std::vector<int64_t>> offsets, lengths;
  std::string rng;
};

// With `device_twin`, odd ranks hold their tensors "on a device" (the CUDA
// device's CPU twin), restored through a pinned buffer so small (two halves of
// 256 bytes) that some tensors are assembled in one half and the others in
// slabs of one, rows or parts of rows at a time.
std::vector<Rank> Ranks(const std::string& socket, const std::string& job,
                        uint32_t world, bool device_twin = false) {
  std::vector<Rank> ranks(world);
  for (uint32_t r = 0; r < world; ++r) {
    client::CheckpointerOptions options{job, r, world, socket};
    if (device_twin && r % 2 == 1) {
      options.device = client::DeviceKind::kCpuQueued;
      options.restore_buffer_bytes = 512;
    }
    auto c = client::Checkpointer::Connect(options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    ranks[r].ckpt = *std::move(c);
    for (const TensorSpec& t : Specs()) {
      std::vector<int64_t> off, len;
      BoxOf(t, r, world, &off, &len);
      ranks[r].tensors.emplace_back(Elements(len) * t.width, 0xcd);
      ranks[r].offsets.push_back(off);
      ranks[r].lengths.push_back(len);
    }
    for (size_t i = 0; i < Specs().size(); ++i) {
      const TensorSpec& t = Specs()[i];
      absl::Status s = ranks[r].ckpt->RegisterTensor(
          t.name, t.dtype, ranks[r].tensors[i].data(), t.shape,
          ranks[r].offsets[i], ranks[r].lengths[i]);
      EXPECT_TRUE(s.ok()) << s;
    }
    EXPECT_TRUE(ranks[r].ckpt->RegisterBytes("rng", &ranks[r].rng).ok());
  }
  return ranks;
}

class ReshardTest
    : public ::testing::TestWithParam<std::pair<uint32_t, uint32_t>> {};

TEST_P(ReshardTest, RestoresEveryElementOntoANewWorldSize) {
  const auto [saved_world, new_world] = GetParam();
  const uint64_t seed = testing::TestSeed();
  testing::DaemonProcess daemon({"--keep-memory", "1", "--keep-disk", "4"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string job = "reshard";
  {
    std::vector<Rank> savers = Ranks(daemon.socket(), job, saved_world);
    ASSERT_EQ(savers.size(), saved_world);
    for (uint64_t step = 1; step <= 2; ++step) {
      auto global = GlobalState(seed, step);
      std::vector<std::shared_ptr<client::SaveHandle>> saves;
      for (uint32_t r = 0; r < saved_world; ++r) {
        for (size_t i = 0; i < Specs().size(); ++i) {
          // Into the registered buffer: its address must not change.
          std::vector<uint8_t> part =
              Extract(global[i], Specs()[i], savers[r].offsets[i],
                      savers[r].lengths[i]);
          std::copy(part.begin(), part.end(), savers[r].tensors[i].begin());
        }
        savers[r].rng = absl::StrCat("rng of rank ", r, " step ", step);
        auto save = savers[r].ckpt->SaveAsync(step);
        ASSERT_TRUE(save.ok()) << save.status();
        saves.push_back(*save);
      }
      for (auto& save : saves)
        ASSERT_TRUE(save->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    }
  }
  // Step 2 is still in memory; step 1's slots left when step 2 was committed
  // there, so it comes from the files.
  std::vector<Rank> restorers =
      Ranks(daemon.socket(), job, new_world, /*device_twin=*/true);
  ASSERT_EQ(restorers.size(), new_world);
  // Garbage collection runs after the commit is announced: wait for it.
  for (int i = 0; i < 500; ++i) {
    auto old = restorers[0].ckpt->DescribeShard(1);
    ASSERT_TRUE(old.ok()) << old.status();
    if (old->slot_path().empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(restorers[0].ckpt->DescribeShard(1)->slot_path().empty())
      << "step 1 must come from the shard files";
  EXPECT_FALSE(restorers[0].ckpt->DescribeShard(2)->slot_path().empty())
      << "step 2 must come from the memory tier";
  for (uint64_t step : {2, 1}) {
    auto global = GlobalState(seed, step);
    for (uint32_t r = 0; r < new_world; ++r) {
      for (auto& t : restorers[r].tensors) std::fill(t.begin(), t.end(), 0xcd);
      absl::Status s = restorers[r].ckpt->Restore(step);
      ASSERT_TRUE(s.ok()) << s << " (" << saved_world << " -> " << new_world
                          << ", step " << step << ", rank " << r << ")";
      for (size_t i = 0; i < Specs().size(); ++i) {
        EXPECT_EQ(restorers[r].tensors[i],
                  Extract(global[i], Specs()[i], restorers[r].offsets[i],
                          restorers[r].lengths[i]))
            << Specs()[i].name << " rank " << r << " step " << step << " seed "
            << seed;
      }
      EXPECT_EQ(restorers[r].rng,
                absl::StrCat("rng of rank ", r < saved_world ? r : 0, " step ",
                             step));
    }
  }
  // A tensor registered with another global shape is refused by name.
  auto c = client::Checkpointer::Connect({job, 0, new_world, daemon.socket()});
  ASSERT_TRUE(c.ok());
  std::vector<float> wrong(38);
  ASSERT_TRUE((*c)->RegisterTensor("model/a", proto::DTYPE_FLOAT32,
                                   wrong.data(), {38}, {0}, {38})
                  .ok());
  absl::Status refused = (*c)->Restore(2);
  EXPECT_FALSE(refused.ok());
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("model/a"));
}

// Data-parallel state: every saved rank holds the whole tensor. A restore onto
// another world size reads one replica per box, and when that replica's file
// is damaged it falls back to another.
TEST(ReshardReplicasTest, ReplicatedStateRestoresFromAnyIntactReplica) {
  testing::DaemonProcess daemon({"--keep-memory", "1", "--keep-disk", "4"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string job = "replicas";
  std::vector<float> expected(1000);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = 0.5f * i;
  {
    std::vector<std::unique_ptr<client::Checkpointer>> savers;
    std::vector<std::vector<float>> copies(3, expected);
    for (uint32_t r = 0; r < 3; ++r) {
      auto c = client::Checkpointer::Connect({job, r, 3, daemon.socket()});
      ASSERT_TRUE(c.ok()) << c.status();
      ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32,
                                       copies[r].data(), {1000}, {0}, {1000})
                      .ok());
      savers.push_back(*std::move(c));
    }
    for (uint64_t step = 1; step <= 2; ++step) {
      std::vector<std::shared_ptr<client::SaveHandle>> saves;
      for (auto& c : savers) saves.push_back(*c->SaveAsync(step));
      for (auto& save : saves)
        ASSERT_TRUE(save->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
    }
  }
  std::vector<std::vector<float>> halves(2, std::vector<float>(500, -1));
  std::vector<std::unique_ptr<client::Checkpointer>> restorers;
  for (uint32_t r = 0; r < 2; ++r) {
    auto c = client::Checkpointer::Connect({job, r, 2, daemon.socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32,
                                     halves[r].data(), {1000}, {r * 500ll},
                                     {500})
                    .ok());
    restorers.push_back(*std::move(c));
  }
  // Step 1 is only on disk once its slots left; damage saved rank 0's file.
  std::string path;
  for (int i = 0; i < 500; ++i) {
    auto old = restorers[0]->DescribeShard(1);
    ASSERT_TRUE(old.ok()) << old.status();
    path = old->shard_path();
    if (old->slot_path().empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_FALSE(path.empty());
  std::string bytes = testing::ReadAll(path);
  for (size_t i = 64; i < bytes.size(); i += 97) bytes[i] ^= 0x5a;
  testing::WriteAll(path, bytes);
  // The same world size: rank 0's own file is damaged, its replicas are not.
  {
    std::vector<float> whole(1000, -1);
    auto c = client::Checkpointer::Connect({job, 0, 3, daemon.socket()});
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE((*c)->RegisterTensor("w", proto::DTYPE_FLOAT32, whole.data(),
                                     {1000}, {0}, {1000})
                    .ok());
    absl::Status s = (*c)->Restore(1);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_EQ(whole, expected);
  }
  for (uint32_t r = 0; r < 2; ++r) {
    absl::Status s = restorers[r]->Restore(1);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(std::equal(halves[r].begin(), halves[r].end(),
                           expected.begin() + r * 500))
        << "rank " << r;
  }
}

// Saved boxes that leave a gap: the restore fails and names the tensor and
// what is missing, on the host and through slabs of the device's buffer alike.
TEST(ReshardGapsTest, ElementsNoSavedBoxCoversAreAnErrorNamingTheTensor) {
  testing::DaemonProcess daemon({"--keep-memory", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::string job = "gaps";
  {
    std::vector<std::vector<float>> parts(2, std::vector<float>(4, 1.5f));
    std::vector<std::unique_ptr<client::Checkpointer>> savers;
    for (uint32_t r = 0; r < 2; ++r) {
      auto c = client::Checkpointer::Connect({job, r, 2, daemon.socket()});
      ASSERT_TRUE(c.ok()) << c.status();
      // [0, 4) and [6, 10) of 10: elements 4 and 5 are saved by no rank.
      ASSERT_TRUE((*c)->RegisterTensor("t", proto::DTYPE_FLOAT32,
                                       parts[r].data(), {10}, {r * 6ll}, {4})
                      .ok());
      savers.push_back(*std::move(c));
    }
    std::vector<std::shared_ptr<client::SaveHandle>> saves;
    for (auto& c : savers) saves.push_back(*c->SaveAsync(1));
    for (auto& save : saves)
      ASSERT_TRUE(save->WaitCommitted(proto::TIER_LOCAL_DISK).ok());
  }
  for (bool device : {false, true}) {
    client::CheckpointerOptions options{job, 0, 1, daemon.socket()};
    if (device) {
      options.device = client::DeviceKind::kCpuQueued;
      options.restore_buffer_bytes = 16;  // slabs of the least, 4 elements
    }
    auto c = client::Checkpointer::Connect(options);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<float> whole(10, -1);
    ASSERT_TRUE((*c)->RegisterTensor("t", proto::DTYPE_FLOAT32, whole.data(),
                                     {10}, {0}, {10})
                    .ok());
    absl::Status s = (*c)->Restore(1);
    EXPECT_TRUE(absl::IsNotFound(s)) << s;
    EXPECT_THAT(std::string(s.message()),
                ::testing::HasSubstr(
                    device ? "\"t\": the shards saved by 2 rank(s) cover 2 of "
                             "the 4 elements of this rank's box from its "
                             "element 4"
                           : "\"t\": the shards saved by 2 rank(s) cover 8 of "
                             "the 10 elements of this rank's box"));
  }
}

INSTANTIATE_TEST_SUITE_P(
    Pairs, ReshardTest,
    ::testing::Values(std::make_pair(1u, 4u), std::make_pair(4u, 1u),
                      std::make_pair(3u, 8u), std::make_pair(8u, 3u),
                      std::make_pair(6u, 24u), std::make_pair(8u, 64u),
                      std::make_pair(4u, 4u)),
    [](const auto& info) {
      return absl::StrCat(info.param.first, "to", info.param.second);
    });

}  // namespace
}  // namespace ckpt
