#include "snapshot/box.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

// Global coordinates of element `i` of a row-major box.
std::vector<int64_t> Coordinates(const Box& box, int64_t i) {
  std::vector<int64_t> at(box.offset.size());
  for (size_t d = at.size(); d-- > 0;) {
    at[d] = box.offset[d] + i % box.length[d];
    i /= box.length[d];
  }
  return at;
}

// Position of global coordinates `at` in a row-major box, or -1 outside it.
int64_t Index(const Box& box, const std::vector<int64_t>& at) {
  int64_t i = 0;
  for (size_t d = 0; d < at.size(); ++d) {
    int64_t rel = at[d] - box.offset[d];
    if (rel < 0 || rel >= box.length[d]) return -1;
    i = i * box.length[d] + rel;
  }
  return i;
}

Box RandomBox(std::mt19937_64& rng, const std::vector<int64_t>& shape) {
  Box b;
  for (int64_t extent : shape) {
    int64_t lo = std::uniform_int_distribution<int64_t>(0, extent)(rng);
    int64_t hi = std::uniform_int_distribution<int64_t>(lo, extent)(rng);
    b.offset.push_back(lo);
    b.length.push_back(hi - lo);
  }
  return b;
}

TEST(BoxTest, IntersectionCopyMatchesElementByElementReference) {
  const uint64_t seed = testing::TestSeed();
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 2000; ++round) {
    const int dims = std::uniform_int_distribution<int>(0, 4)(rng);
    std::vector<int64_t> shape;
    for (int d = 0; d < dims; ++d)
      shape.push_back(std::uniform_int_distribution<int64_t>(1, 7)(rng));
    const size_t width = size_t{1}
                         << std::uniform_int_distribution<int>(0, 3)(rng);
    Box src = RandomBox(rng, shape), dst = RandomBox(rng, shape);
    if (round % 5 == 0) dst = Box{std::vector<int64_t>(dims, 0), shape};
    std::vector<uint8_t> in(src.elements() * width),
        out(dst.elements() * width), want;
    for (uint8_t& b : in) b = static_cast<uint8_t>(rng());
    for (uint8_t& b : out) b = static_cast<uint8_t>(rng());
    want = out;
    int64_t expected = 0;
    for (int64_t i = 0; i < src.elements(); ++i) {
      int64_t j = Index(dst, Coordinates(src, i));
      if (j < 0) continue;
      ++expected;
      std::copy_n(in.begin() + i * width, width, want.begin() + j * width);
    }
    int64_t copied =
        CopyBoxIntersection(in, src, absl::MakeSpan(out), dst, width);
    ASSERT_EQ(copied, expected) << "round " << round << " seed " << seed;
    ASSERT_EQ(out, want) << "round " << round << " seed " << seed;
  }
}

TEST(BoxTest, DisjointBoxesCopyNothing) {
  Box a{{0, 0}, {2, 3}}, b{{2, 0}, {2, 3}};
  std::vector<uint8_t> in(6, 1), out(6, 0);
  EXPECT_EQ(CopyBoxIntersection(in, a, absl::MakeSpan(out), b, 1), 0);
  EXPECT_EQ(out, std::vector<uint8_t>(6, 0));
  EXPECT_EQ(Intersect(a, b).elements(), 0);
}

// Slabs tile the box in layout order, each within the limit, and each one's
// elements are the contiguous run of the box's layout it says it starts at.
TEST(BoxTest, ContiguousSlabsTileTheLayoutInOrder) {
  std::mt19937_64 rng(testing::TestSeed());
  for (int trial = 0; trial < 500; ++trial) {
    const size_t dims = rng() % 5;
    Box box;
    for (size_t d = 0; d < dims; ++d) {
      box.offset.push_back(static_cast<int64_t>(rng() % 5));
      box.length.push_back(static_cast<int64_t>(1 + rng() % 6));
    }
    const int64_t n = box.elements();
    const int64_t limit = static_cast<int64_t>(rng() % (n + 2));
    std::vector<uint8_t> layout(static_cast<size_t>(n) * 2);
    for (size_t i = 0; i < layout.size(); ++i)
      layout[i] = static_cast<uint8_t>(i * 7 + 1);
    int64_t next = 0;
    for (const Slab& slab : ContiguousSlabs(box, limit)) {
      const int64_t m = slab.box.elements();
      ASSERT_GT(m, 0);
      ASSERT_LE(m, std::max<int64_t>(1, limit)) << "trial " << trial;
      ASSERT_EQ(slab.first, next) << "trial " << trial;
      std::vector<uint8_t> part(static_cast<size_t>(m) * 2);
      ASSERT_EQ(
          CopyBoxIntersection(layout, box, absl::MakeSpan(part), slab.box, 2),
          m);
      ASSERT_TRUE(
          std::equal(part.begin(), part.end(), layout.begin() + slab.first * 2))
          << "trial " << trial;
      next += m;
    }
    EXPECT_EQ(next, n) << "trial " << trial;
  }
  EXPECT_TRUE(ContiguousSlabs(Box{{0, 0}, {3, 0}}, 4).empty());
  // A 4 x 5 x 6 box by 12 elements: two rows of the last dimension at a time.
  const std::vector<Slab> slabs =
      ContiguousSlabs(Box{{0, 0, 0}, {4, 5, 6}}, 12);
  EXPECT_EQ(slabs.size(), 4u * 3u);
  EXPECT_EQ(slabs[2].box.length, (std::vector<int64_t>{1, 1, 6}));
}

}  // namespace
}  // namespace ckpt::snapshot
