// The C API against a real ckptd: save a tensor and a buffer, commit, restore;
// errors as codes with messages.
#include <cstring>
#include <string>
#include <vector>

#include "client/ckpt.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"

namespace {

using ::testing::HasSubstr;

TEST(CApiTest, SaveCommitRestore) {
  ckpt::testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  ckpt_checkpointer* c = nullptr;
  ASSERT_EQ(ckpt_connect("cjob", 0, 1, daemon.socket().c_str(), &c), 0)
      << ckpt_last_error();
  std::vector<double> w(1000);
  for (size_t i = 0; i < w.size(); ++i) w[i] = i * 0.5;
  char rng[16] = "seed-1234";
  const int64_t shape[] = {1000}, offset[] = {0}, length[] = {1000};
  ASSERT_EQ(ckpt_register_tensor(c, "w", CKPT_DTYPE_FLOAT64, w.data(), 1, shape,
                                 offset, length),
            0);
  ASSERT_EQ(ckpt_register_buffer(c, "rng", rng, sizeof rng), 0);
  ckpt_save* save = nullptr;
  ASSERT_EQ(ckpt_save_async(c, 7, &save), 0) << ckpt_last_error();
  ASSERT_EQ(ckpt_save_order_stream(save, nullptr), 0);  // host: waits
  ASSERT_EQ(ckpt_save_wait_staged(save), 0);
  const std::vector<double> saved = w;
  w.assign(w.size(), -1);
  std::strcpy(rng, "changed");
  ASSERT_EQ(ckpt_save_wait_committed(save, CKPT_TIER_LOCAL_DISK, 30000), 0)
      << ckpt_last_error();
  ckpt_save_free(save);
  uint64_t step = 0;
  int found = 0;
  ASSERT_EQ(ckpt_latest_committed(c, CKPT_TIER_LOCAL_DISK, &step, &found), 0);
  EXPECT_EQ(found, 1);
  EXPECT_EQ(step, 7u);
  ASSERT_EQ(ckpt_restore(c, 7), 0) << ckpt_last_error();
  EXPECT_EQ(w, saved);
  EXPECT_STREQ(rng, "seed-1234");
  // Errors: a code and a message.
  EXPECT_EQ(ckpt_register_tensor(c, "w", CKPT_DTYPE_FLOAT64, w.data(), 1, shape,
                                 offset, length),
            6 /* already exists */);
  EXPECT_THAT(ckpt_last_error(), HasSubstr("already registered"));
  EXPECT_EQ(ckpt_restore(c, 99), 5 /* not found */);
  EXPECT_THAT(ckpt_last_error(), HasSubstr("step 99"));
  ckpt_close(c);
  ckpt_checkpointer* bad = nullptr;
  EXPECT_EQ(ckpt_connect("../x", 0, 1, daemon.socket().c_str(), &bad),
            3 /* invalid */);
  EXPECT_THAT(ckpt_last_error(), HasSubstr("job id"));
  EXPECT_EQ(bad, nullptr);
  EXPECT_EQ(ckpt_connect_cuda("cjob", 0, 1, daemon.socket().c_str(), -1,
                              nullptr, &bad),
            3 /* invalid */);
  EXPECT_THAT(ckpt_last_error(), HasSubstr("CUDA device -1"));
  EXPECT_EQ(ckpt_connect_cuda_flags("cjob", 0, 1, daemon.socket().c_str(), 0,
                                    nullptr, 6, &bad),
            3 /* invalid */);
  EXPECT_THAT(ckpt_last_error(), HasSubstr("unknown flags 6"));
  // Without a GPU the CUDA device is refused, naming why; with one, it works.
  int rc = ckpt_connect_cuda("cjob", 0, 1, daemon.socket().c_str(), 0, nullptr,
                             &bad);
  if (rc != 0) {
    EXPECT_THAT(ckpt_last_error(), HasSubstr("CUDA device 0"));
    EXPECT_EQ(bad, nullptr);
  }
  ckpt_close(bad);
}

}  // namespace
