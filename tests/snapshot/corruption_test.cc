// Every single-byte flip anywhere in a shard file (chunk headers, stored bytes,
// padding, manifest, footer) is detected, and no read ever returns wrong bytes
// silently. Truncations too.
#include <fcntl.h>
#include <unistd.h>

#include <random>

#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/thread_pool.h"
#include "snapshot/shard_check.h"
#include "snapshot/shard_reader.h"
#include "tests/snapshot/sample_shard.h"
#include "tests/test_util.h"

namespace ckpt::snapshot {
namespace {

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = testing::TestSeed();
    sample_ = std::make_unique<testing::SampleShard>(seed_);
    path_ = dir_.File("s.shard");
    ASSERT_TRUE(sample_->Write(io::DefaultFileSystem(), path_, 1).ok());
    original_ = testing::ReadAll(path_);
    ASSERT_GT(original_.size(), 8u * 4096)
        << "several chunks, manifest and footer";
  }

  // True when the corruption is noticed; fails the test if any read returned
  // wrong bytes.
  bool Detected() {
    ShardReaderOptions options{.direct_io = false, .pool = &pool_};
    auto reader = ShardReader::Open(io::DefaultFileSystem(), path_, options);
    if (!reader.ok()) return true;
    bool detected = !(*reader)->VerifyAll().empty();
    for (const auto& [name, bytes] : sample_->items) {
      std::vector<uint8_t> back(bytes.size());
      absl::Status s = (*reader)->ReadItem(name, absl::MakeSpan(back));
      if (s.ok()) {
        EXPECT_EQ(back, bytes) << "silent corruption of " << name;
      } else {
        detected = true;
      }
    }
    return detected;
  }

  void PutByte(size_t pos, char c) {
    int fd = ::open(path_.c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, &c, 1, static_cast<off_t>(pos)), 1);
    ::close(fd);
  }

  uint64_t seed_;
  io::ThreadPool pool_{2};
  testing::TempDir dir_;
  std::unique_ptr<testing::SampleShard> sample_;
  std::string path_;
  std::string original_;
};

TEST_F(CorruptionTest, IntactShardPasses) {
  EXPECT_FALSE(Detected());
  // The flips below also cover chunks stored in place (the header padded to
  // the alignment).
  auto reader = ShardReader::Open(io::DefaultFileSystem(), path_);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto page = (*reader)->FindItem("page");
  ASSERT_TRUE(page.ok());
  ASSERT_EQ((*page)->chunks_size(), 4);
  for (int c = 0; c < 3; ++c)
    EXPECT_EQ((*page)->chunks(c).stored_offset(), kAlignment) << c;
  EXPECT_EQ((*page)->chunks(3).stored_offset(), kChunkHeaderSize);
}

TEST_F(CorruptionTest, EverySingleByteFlipIsDetected) {
  std::mt19937_64 rng(seed_);
  int undetected = 0;
  for (size_t pos = 0; pos < original_.size(); ++pos) {
    char flipped =
        static_cast<char>(original_[pos] ^ static_cast<char>(1 + rng() % 255));
    PutByte(pos, flipped);
    if (!Detected()) {
      ++undetected;
      ADD_FAILURE() << "flip at offset " << pos << " not detected";
      if (undetected > 10) break;
    }
    PutByte(pos, original_[pos]);
  }
  EXPECT_EQ(undetected, 0);
  EXPECT_FALSE(Detected()) << "restored file reads clean";
}

// The one-pass check of a copy held in memory (a peer's copy, a file rebuilt
// from parity) catches every flip the reader does.
TEST_F(CorruptionTest, CheckShardBytesCatchesEveryFlipInMemory) {
  std::vector<uint8_t> bytes(original_.begin(), original_.end());
  absl::StatusOr<proto::ShardManifest> intact =
      CheckShardBytes(bytes, /*every_chunk=*/true);
  ASSERT_TRUE(intact.ok()) << intact.status();
  EXPECT_EQ(intact->items_size(), static_cast<int>(sample_->items.size()));
  std::mt19937_64 rng(seed_);
  int undetected = 0;
  for (size_t pos = 0; pos < bytes.size() && undetected <= 10; ++pos) {
    const uint8_t was = bytes[pos];
    bytes[pos] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (CheckShardBytes(bytes, true).ok()) {
      ++undetected;
      ADD_FAILURE() << "flip at offset " << pos << " not detected";
    }
    bytes[pos] = was;
  }
  EXPECT_EQ(undetected, 0);
  // Without every chunk: the footer and manifest only.
  bytes[100] ^= 1;
  EXPECT_TRUE(CheckShardBytes(bytes, /*every_chunk=*/false).ok());
  absl::Status bad = CheckShardBytes(bytes, true).status();
  EXPECT_TRUE(absl::IsDataLoss(bad)) << bad;
  EXPECT_NE(bad.message().find("chunk 0 at file offset 0"),
            absl::string_view::npos)
      << bad;
  bytes[100] ^= 1;
  for (size_t len : {size_t{0}, size_t{1}, size_t{4096}, bytes.size() - 4096}) {
    EXPECT_FALSE(
        CheckShardBytes(absl::MakeConstSpan(bytes.data(), len), true).ok())
        << "truncated to " << len;
  }
}

TEST_F(CorruptionTest, TruncationsAndExtensionsAreDetected) {
  std::mt19937_64 rng(seed_);
  std::vector<size_t> lengths = {0,
                                 1,
                                 4095,
                                 4096,
                                 original_.size() - 4096,
                                 original_.size() - 64,
                                 original_.size() - 1};
  for (int i = 0; i < 20; ++i) lengths.push_back(rng() % original_.size());
  for (size_t len : lengths) {
    testing::WriteAll(path_, original_.substr(0, len));
    EXPECT_TRUE(Detected()) << "truncated to " << len;
  }
  testing::WriteAll(path_, original_ + std::string(4096, '\0'));
  EXPECT_TRUE(Detected()) << "extended by a block";
  testing::WriteAll(path_, std::string(4096, '\0') + original_);
  EXPECT_TRUE(Detected()) << "shifted by a block";
}

}  // namespace
}  // namespace ckpt::snapshot
