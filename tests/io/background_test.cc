// io::EnterBackground lowers the calling thread's priority alone, by the
// increment the process set; threads it starts inherit it.
#include "io/background.h"

#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "gtest/gtest.h"

namespace ckpt::io {
namespace {

int MyNice() {
  return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::syscall(SYS_gettid)));
}

TEST(BackgroundTest, OnlyTheThreadThatEntersItIsLowered) {
  const int base = MyNice();
  SetBackgroundNice(5);
  int lowered = 0, child = 0, other = 0;
  std::thread([&] {
    EnterBackground();
    lowered = MyNice();
    std::thread([&] { child = MyNice(); }).join();
  }).join();
  std::thread([&] { other = MyNice(); }).join();
  EXPECT_EQ(lowered, std::min(19, base + 5));
  EXPECT_EQ(child, lowered) << "threads it starts inherit it";
  EXPECT_EQ(other, base);
  EXPECT_EQ(MyNice(), base);
  SetBackgroundNice(0);
  std::thread([&] {
    EnterBackground();
    lowered = MyNice();
  }).join();
  EXPECT_EQ(lowered, base) << "0: unchanged";
  SetBackgroundNice(99);
  EXPECT_EQ(BackgroundNice(), 19);
  SetBackgroundNice(0);
}

}  // namespace
}  // namespace ckpt::io
