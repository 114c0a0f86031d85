// Compares a device's byte-shuffle and chunk hashes with the CPU reference on
// random inputs of awkward sizes.
#ifndef CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
#define CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_

#include <algorithm>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/device.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/filter.h"
#include "tests/test_util.h"

namespace ckpt::kernels {

// Every width, sizes with and without whole groups of four elements, and
// sources and destinations off their alignment (a GPU kernel's vector paths
// and their fallbacks).
inline void ExpectShuffleMatchesReference(Device* device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (size_t width : {1u, 2u, 3u, 4u, 8u}) {
    for (size_t n : {0ul, 1ul, 7ul, 31ul, 4096ul, 4100ul, 1000003ul}) {
      // (source, destination) shifts from the allocations' alignment.
      for (auto [shift, dst_shift] :
           {std::pair<size_t, size_t>{0, 0}, {1, 1}, {4, 0}, {0, 2}}) {
        std::vector<uint8_t> src = testing::RandomBytes(rng, n), expected(n),
                             actual(n);
        snapshot::ByteShuffle(src.data(), expected.data(), n, width);
        auto in = device->Allocate(n + shift);
        auto out = device->Allocate(n + dst_shift);
        ASSERT_TRUE(in.ok() && out.ok());
        uint8_t* from = static_cast<uint8_t*>(*in) + shift;
        uint8_t* to = static_cast<uint8_t*>(*out) + dst_shift;
        ASSERT_TRUE(device->CopyFromHost(src.data(), from, n).ok());
        ASSERT_TRUE(device->ByteShuffle(from, to, n, width).ok());
        ASSERT_TRUE(device->CopyToHost(to, actual.data(), n).ok());
        ASSERT_TRUE(device->Synchronize().ok());
        EXPECT_EQ(actual, expected)
            << device->name() << " width " << width << " n " << n << " shifts "
            << shift << ", " << dst_shift;
        device->Free(*in);
        device->Free(*out);
      }
    }
  }
}

// A batched gather and a batch of chunk hashes over hundreds of pieces of
// device memory of random sizes (within one table entry and across several),
// at unaligned sources and destinations: identical to copying and hashing
// each piece on the host.
inline void ExpectBatchesMatchReference(Device* device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 3; ++round) {
    const size_t count = 50 + rng() % 400;
    std::vector<std::vector<uint8_t>> host(count);
    std::vector<void*> on_device(count);
    std::vector<GatherPiece> pieces;
    std::vector<HashRun> runs;
    uint64_t offset = rng() % 64;
    for (size_t i = 0; i < count; ++i) {
      // Log-uniform from 0 to about 200 KiB: mostly small, some spanning
      // several of a gather's 64 KiB entries.
      const size_t n =
          i % 37 == 0 ? 0 : (size_t{1} << (rng() % 18)) + rng() % 999;
      const size_t shift = rng() % 9;
      host[i] = testing::RandomBytes(rng, n);
      auto p = device->Allocate(n + shift);
      ASSERT_TRUE(p.ok()) << p.status();
      on_device[i] = *p;
      uint8_t* at = static_cast<uint8_t*>(*p) + shift;
      ASSERT_TRUE(device->CopyFromHost(host[i].data(), at, n).ok());
      pieces.push_back({at, n, offset});
      runs.push_back({at, n});
      offset += n + (i % 3 == 0 ? 64 - n % 64 : rng() % 5);
    }
    auto gather = device->PrepareGather(pieces);
    ASSERT_TRUE(gather.ok()) << gather.status();
    const size_t chunk = 1 + rng() % 70000;
    auto hashes = device->PrepareHashes(runs, chunk);
    ASSERT_TRUE(hashes.ok()) << hashes.status();
    std::vector<uint8_t> expected((*gather)->outputs(), 0xee);
    std::vector<uint64_t> expected_hashes;
    for (size_t i = 0; i < count; ++i) {
      std::copy(host[i].begin(), host[i].end(),
                expected.begin() + static_cast<ptrdiff_t>(pieces[i].offset));
      for (size_t at = 0; at < host[i].size(); at += chunk) {
        expected_hashes.push_back(snapshot::Checksum(
            {host[i].data() + at, std::min(chunk, host[i].size() - at)}));
      }
    }
    ASSERT_EQ((*hashes)->outputs(), expected_hashes.size());
    auto dst = device->Allocate(expected.size());
    ASSERT_TRUE(dst.ok()) << dst.status();
    std::vector<uint8_t> actual(expected.size(), 0xee);
    ASSERT_TRUE(device->CopyFromHost(actual.data(), *dst, actual.size()).ok());
    std::vector<uint64_t> actual_hashes(expected_hashes.size());
    ASSERT_TRUE(device->Gather(**gather, *dst).ok());
    ASSERT_TRUE(device->HashBatch(**hashes, actual_hashes.data()).ok());
    ASSERT_TRUE(device->CopyToHost(*dst, actual.data(), actual.size()).ok());
    ASSERT_TRUE(device->Synchronize().ok());
    EXPECT_TRUE(actual == expected) << device->name() << ": gather of " << count
                                    << " pieces, round " << round;
    EXPECT_EQ(actual_hashes, expected_hashes)
        << device->name() << ": " << chunk << "-byte chunks, round " << round;
    EXPECT_FALSE(device->Gather(**hashes, *dst).ok()) << "kinds are checked";
    device->Free(*dst);
    for (void* p : on_device) device->Free(p);
  }
}

// Chunk hashes of pieces of every length class XXH3 has (short, mid-size,
// whole 1 KiB blocks and not), at offsets that are not multiples of 8.
inline void ExpectHashChunksMatchReference(Device* device, uint64_t seed) {
  std::mt19937_64 rng(seed);
  struct Case {
    size_t n, chunk, offset;
  };
  std::vector<Case> cases = {{0, 64, 0},
                             {1, 64, 0},
                             {240, 240, 0},
                             {241, 1024, 3},
                             {1025, 1024, 1},
                             {4096, 1000, 7},
                             {3 << 20, 1 << 20, 0},
                             {(5 << 20) + 13, 4 << 20, 5}};
  for (int i = 0; i < 20; ++i) {
    const size_t chunk = 1 + rng() % 70000;
    cases.push_back({rng() % (4 * chunk), chunk, rng() % 16});
  }
  for (const Case& c : cases) {
    const std::vector<uint8_t> src = testing::RandomBytes(rng, c.n + c.offset);
    const size_t count = (c.n + c.chunk - 1) / c.chunk;
    std::vector<uint64_t> expected(count), actual(count, 0);
    for (size_t i = 0; i < count; ++i) {
      const size_t at = i * c.chunk;
      expected[i] = snapshot::Checksum(
          {src.data() + c.offset + at, std::min(c.chunk, c.n - at)});
    }
    auto in = device->Allocate(src.size());
    ASSERT_TRUE(in.ok()) << in.status();
    ASSERT_TRUE(device->CopyFromHost(src.data(), *in, src.size()).ok());
    absl::Status hashed =
        device->HashChunks(static_cast<const uint8_t*>(*in) + c.offset, c.n,
                           c.chunk, actual.data());
    ASSERT_TRUE(hashed.ok()) << hashed;
    ASSERT_TRUE(device->Synchronize().ok());
    EXPECT_EQ(actual, expected) << device->name() << " n " << c.n << " chunk "
                                << c.chunk << " offset " << c.offset;
    device->Free(*in);
  }
}

}  // namespace ckpt::kernels

#endif  // CKPT_TESTS_KERNELS_DEVICE_TEST_UTIL_H_
