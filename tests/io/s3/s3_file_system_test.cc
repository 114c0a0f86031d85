// S3FileSystem against a real S3 server: shard files written through it as
// multipart uploads (of parts smaller than the file) read back through
// ShardReader by ranges, every chunk checked; an increment reads its base
// beside it in the bucket; writes out of order, renames and unclosed uploads
// leave nothing behind. Randomized bytes print their seed.
#include "io/s3/s3_file_system.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "snapshot/format.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"
#include "tests/io/s3/test_server.h"
#include "tests/test_util.h"

namespace ckpt::io::s3 {
namespace {

using ::testing::HasSubstr;

class S3FileSystemTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<S3Client>> c =
        S3Client::Create(TestOptions());
    ASSERT_TRUE(c.ok()) << c.status();
    client_ = *std::move(c);
    ASSERT_TRUE(client_->CreateBucket("ckpt-test").ok());
    // Parts and ranges far smaller than the files: every path is taken.
    fs_ = std::make_unique<S3FileSystem>(
        client_,
        S3FileSystemOptions{
            .part_bytes = 5 << 20, .range_bytes = 1 << 20, .concurrency = 4});
    dir_ = absl::StrCat(
        "s3://ckpt-test/fs/",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }

  // A shard of job "j", rank 0, in the local directory: `items` of random
  // bytes, an increment over `base` if given.
  std::shared_ptr<snapshot::ShardBase> WriteLocal(
      uint64_t step, const std::vector<std::vector<uint8_t>>& items,
      std::shared_ptr<snapshot::ShardBase> base = nullptr) {
    const std::string path =
        local_.File(snapshot::ShardFileName(step, 0, ".ckpt"));
    snapshot::ShardWriterOptions options;
    options.chunk_size = 1 << 20;
    options.base = std::move(base);
    snapshot::ShardWriter writer(DefaultFileSystem(), path, {"j", step, 0, 1},
                                 options);
    for (size_t i = 0; i < items.size(); ++i) {
      EXPECT_TRUE(writer.AddBytes(absl::StrCat("item", i), items[i]).ok());
    }
    absl::StatusOr<proto::ShardManifest> m = writer.Commit();
    EXPECT_TRUE(m.ok()) << m.status();
    auto written = std::make_shared<snapshot::ShardBase>();
    written->manifest = *m;
    written->manifest_xxh3 = writer.manifest_xxh3();
    return written;
  }

  // The local file of `step` copied to the bucket as it is.
  void Upload(uint64_t step) {
    const std::string name = snapshot::ShardFileName(step, 0, ".ckpt");
    absl::StatusOr<std::string> bytes =
        ReadFileToString(DefaultFileSystem(), local_.File(name));
    ASSERT_TRUE(bytes.ok());
    absl::StatusOr<std::unique_ptr<WritableFile>> out =
        fs_->NewWritableFile(JoinPath(dir_, name), {});
    ASSERT_TRUE(out.ok());
    ASSERT_TRUE((*out)
                    ->WriteBorrowed(
                        0, absl::MakeConstSpan(
                               reinterpret_cast<const uint8_t*>(bytes->data()),
                               bytes->size()))
                    .ok());
    absl::Status closed = (*out)->Close();
    ASSERT_TRUE(closed.ok()) << closed;
  }

  void ExpectReads(const std::string& path,
                   const std::vector<std::vector<uint8_t>>& items) {
    absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
        snapshot::ShardReader::Open(fs_.get(), path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    for (size_t i = 0; i < items.size(); ++i) {
      std::vector<uint8_t> out(items[i].size());
      absl::Status read =
          (*reader)->ReadItem(absl::StrCat("item", i), absl::MakeSpan(out));
      ASSERT_TRUE(read.ok()) << read;
      EXPECT_TRUE(out == items[i]) << path << " item " << i;
    }
  }

  std::shared_ptr<S3Client> client_;
  std::unique_ptr<S3FileSystem> fs_;
  std::string dir_;
  testing::TempDir local_;
  std::mt19937_64 rng_{testing::TestSeed()};
};

TEST_F(S3FileSystemTest, AShardUploadedInPartsReadsBackByRanges) {
  const std::vector<std::vector<uint8_t>> items = {
      testing::RandomBytes(rng_, (13 << 20) + 7), testing::RandomBytes(rng_, 1),
      testing::RandomBytes(rng_, 3 << 20)};
  WriteLocal(1, items);
  absl::StatusOr<snapshot::SelfContained> view = snapshot::OpenSelfContained(
      DefaultFileSystem(), local_.File(snapshot::ShardFileName(1, 0, ".ckpt")));
  ASSERT_TRUE(view.ok()) << view.status();
  const std::string path =
      JoinPath(dir_, snapshot::ShardFileName(1, 0, ".ckpt"));
  absl::Status written = snapshot::WriteSelfContained(fs_.get(), *view, path);
  ASSERT_TRUE(written.ok()) << written;
  absl::StatusOr<uint64_t> size = fs_->FileSize(path);
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, view->size);
  ExpectReads(path, items);
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(dir_);
  ASSERT_TRUE(names.ok()) << names.status();
  EXPECT_THAT(*names,
              ::testing::ElementsAre(snapshot::ShardFileName(1, 0, ".ckpt")));
  absl::StatusOr<std::vector<std::string>> parent =
      fs_->ListDir("s3://ckpt-test/fs");
  ASSERT_TRUE(parent.ok());
  EXPECT_THAT(*parent,
              ::testing::Contains("AShardUploadedInPartsReadsBackByRanges"));
  ASSERT_TRUE(fs_->Unlink(path).ok());
  EXPECT_FALSE(*fs_->Exists(path));
  absl::Status gone = fs_->NewReadableFile(path, {}).status();
  EXPECT_TRUE(absl::IsNotFound(gone)) << gone;
}

TEST_F(S3FileSystemTest, AnIncrementReadsItsBaseBesideItInTheBucket) {
  std::vector<std::vector<uint8_t>> items = {
      testing::RandomBytes(rng_, 4 << 20), testing::RandomBytes(rng_, 100)};
  std::shared_ptr<snapshot::ShardBase> base = WriteLocal(1, items);
  const std::vector<std::vector<uint8_t>> first = items;
  items[0][(3 << 20) + 5] ^= 1;  // one chunk of four changes
  WriteLocal(2, items, base);
  Upload(1);
  Upload(2);
  const std::string increment =
      JoinPath(dir_, snapshot::ShardFileName(2, 0, ".ckpt"));
  absl::StatusOr<uint64_t> size = fs_->FileSize(increment);
  ASSERT_TRUE(size.ok());
  EXPECT_LT(*size, 2u << 20) << "only the changed chunk is in it";
  ExpectReads(increment, items);
  ExpectReads(JoinPath(dir_, snapshot::ShardFileName(1, 0, ".ckpt")), first);
  // Its self-contained form, read from both objects, stands alone.
  absl::StatusOr<snapshot::SelfContained> whole =
      snapshot::OpenSelfContained(fs_.get(), increment);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_TRUE(whole->incremental);
  const std::string copy = local_.File("copy.ckpt");
  ASSERT_TRUE(
      snapshot::WriteSelfContained(DefaultFileSystem(), *whole, copy).ok());
  absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
      snapshot::ShardReader::Open(DefaultFileSystem(), copy);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<uint8_t> out(items[0].size());
  ASSERT_TRUE((*reader)->ReadItem("item0", absl::MakeSpan(out)).ok());
  EXPECT_TRUE(out == items[0]);
}

TEST_F(S3FileSystemTest, WhatAnObjectStoreCannotDoIsNamedAndLeavesNothing) {
  const std::string path = JoinPath(dir_, "x");
  auto file = fs_->NewWritableFile(path, {});
  ASSERT_TRUE(file.ok());
  const std::vector<uint8_t> bytes = testing::RandomBytes(rng_, 6 << 20);
  ASSERT_TRUE((*file)->WriteBorrowed(0, bytes).ok());  // a part is sent
  absl::Status skipped = (*file)->WriteBorrowed(bytes.size() + 1, bytes);
  EXPECT_TRUE(absl::IsUnimplemented(skipped)) << skipped;
  EXPECT_THAT(skipped.message(), HasSubstr(path));
  EXPECT_FALSE((*file)->Close().ok());
  file->reset();
  // Nothing of it: no object, no upload left open.
  EXPECT_FALSE(*fs_->Exists(path));
  absl::StatusOr<std::vector<MultipartUpload>> open =
      client_->ListMultipartUploads("ckpt-test", "fs/");
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());
  // An upload dropped before Close is aborted.
  file = fs_->NewWritableFile(path, {});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->WriteBorrowed(0, bytes).ok());
  file->reset();
  open = client_->ListMultipartUploads("ckpt-test", "fs/");
  ASSERT_TRUE(open.ok());
  EXPECT_TRUE(open->empty());
  EXPECT_FALSE(*fs_->Exists(path));
  // An empty object (a pin) is one request.
  file = fs_->NewWritableFile(path + ".pin", {});
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Close().ok());
  EXPECT_EQ(*fs_->FileSize(path + ".pin"), 0u);
  for (absl::Status s :
       {fs_->Rename(path + ".pin", path), fs_->HardLink(path + ".pin", path),
        fs_->MapFile(path, {}).status()}) {
    EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
    EXPECT_THAT(s.message(), HasSubstr(path));
  }
  EXPECT_TRUE(absl::IsInvalidArgument(fs_->FileSize("/local/file").status()));
}

}  // namespace
}  // namespace ckpt::io::s3
