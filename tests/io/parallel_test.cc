#include "io/parallel.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace ckpt::io {
namespace {

TEST(ParallelTest, EveryIndexRunsOnceOnTheThreadsAsked) {
  std::vector<std::atomic<int>> ran(1000);
  ParallelFor(ran.size(), 4, [&](size_t i) { ++ran[i]; });
  for (size_t i = 0; i < ran.size(); ++i) ASSERT_EQ(ran[i], 1) << i;
  std::atomic<int> calls{0};
  EXPECT_EQ(RunOnThreads(3, [&] { ++calls; }), 4);
  EXPECT_EQ(calls, 4);
}

// A process that may start no more threads (a thread limit reached under
// load) still does the whole work, on the calling thread: before, the
// std::thread vector unwound by pthread_create's error aborted the process
// ("terminate called without an active exception").
TEST(ParallelTest, ThreadsTheSystemRefusesLeaveTheWorkToTheCaller) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to run as nobody";
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    // RLIMIT_NPROC binds only an unprivileged user: nobody, with room for
    // no thread beyond its processes.
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    rlimit none{0, 0};
    if (::setrlimit(RLIMIT_NPROC, &none) != 0) ::_exit(11);
    std::vector<int> ran(64, 0);
    try {
      ParallelFor(ran.size(), 8, [&](size_t i) { ++ran[i]; });
    } catch (...) {
      ::_exit(12);
    }
    for (int r : ran) {
      if (r != 1) ::_exit(13);
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "killed by signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace ckpt::io
