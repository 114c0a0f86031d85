// ckptd under a supervisor (systemd's Type=notify protocol, spoken to a
// socket of the test's own): READY once it serves, watchdog pings while it is
// live and none once a disk hangs, STOPPING on SIGTERM; and a SIGTERM that
// runs past --stop-timeout stops the persist in flight without leaving a
// half-written file, its shard persisted by the next start.
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/daemon.grpc.pb.h"
#include "tests/client/connected_rank.h"
#include "tests/client/daemon_process.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;

// The supervisor's end: a datagram socket ckptd is told about through
// $NOTIFY_SOCKET (set for the daemons this object's lifetime starts).
class NotifySocket {
 public:
  explicit NotifySocket(std::string path) : path_(std::move(path)) {
    fd_ = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path_.c_str(), sizeof(addr.sun_path) - 1);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
        << std::strerror(errno);
    ::setenv("NOTIFY_SOCKET", path_.c_str(), 1);
  }
  ~NotifySocket() {
    ::unsetenv("NOTIFY_SOCKET");
    ::unsetenv("WATCHDOG_USEC");
    ::close(fd_);
  }

  // The next message, or "" if none came within `timeout`.
  std::string Receive(absl::Duration timeout) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout))) <=
        0) {
      return "";
    }
    char buf[4096];
    ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
  }
  // Waits up to `timeout` for a message containing `what`; returns it.
  std::string Await(const std::string& what, absl::Duration timeout) {
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end) {
      std::string m = Receive(end - absl::Now());
      if (m.find(what) != std::string::npos) return m;
    }
    return "";
  }

 private:
  std::string path_;
  int fd_ = -1;
};

absl::Status SlowDisk(const std::string& socket, uint64_t bytes_per_second) {
  auto stub = proto::CkptDaemon::NewStub(grpc::CreateChannel(
      "unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  proto::InjectFaultsRequest req;
  req.set_write_bytes_per_second(bytes_per_second);
  proto::InjectFaultsResponse resp;
  grpc::Status s = stub->InjectFaults(&context, req, &resp);
  return s.ok() ? absl::OkStatus() : absl::InternalError(s.error_message());
}

// One rank with `n` random (incompressible) floats: persisting them writes
// n * 4 bytes whatever the codec decides.
struct Rank {
  std::vector<uint32_t> w;
  std::unique_ptr<Checkpointer> ckpt;
  Rank(const std::string& socket, size_t n) : w(n) {
    std::mt19937 rng(7);
    for (uint32_t& x : w) x = rng();
    const int64_t len = static_cast<int64_t>(n);
    ckpt = ConnectRank({"job", 0, 1, socket},
                       {.w = reinterpret_cast<float*>(w.data()),
                        .global = len,
                        .length = len,
                        .tensor = "w"});
  }
};

TEST(SupervisionTest, ReadyWatchdogPingsAndStoppingOnSigterm) {
  testing::TempDir dir;
  NotifySocket supervisor(dir.File("notify"));
  ::setenv("WATCHDOG_USEC", "400000", 1);
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  EXPECT_THAT(supervisor.Await("READY=1", absl::Seconds(20)),
              HasSubstr("STATUS=serving"))
      << daemon.log();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(supervisor.Await("WATCHDOG=1", absl::Seconds(20)), "WATCHDOG=1")
        << daemon.log();
  }
  EXPECT_EQ(daemon.Stop(), 0);
  EXPECT_THAT(supervisor.Await("STOPPING=1", absl::Seconds(5)),
              HasSubstr("STOPPING=1"));
}

TEST(SupervisionTest, AHungDiskStopsTheWatchdogPings) {
  testing::TempDir dir;
  NotifySocket supervisor(dir.File("notify"));
  ::setenv("WATCHDOG_USEC", "1000000", 1);
  testing::DaemonProcess daemon({"--fault-injection"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  ASSERT_FALSE(supervisor.Await("WATCHDOG=1", absl::Seconds(20)).empty())
      << daemon.log();
  // One byte a second: the persist's first write never ends.
  ASSERT_TRUE(SlowDisk(daemon.socket(), 1).ok());
  Rank rank(daemon.socket(), 1 << 20);
  ASSERT_TRUE(rank.ckpt);
  auto save = rank.ckpt->SaveAsync(1);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WaitStaged().ok());
  // Within a few watchdog intervals the pings stop for good: a whole
  // interval and more goes by without one.
  bool silent = false;
  for (int i = 0; i < 40 && !silent; ++i)
    silent = supervisor.Await("WATCHDOG=1", absl::Seconds(2)).empty();
  EXPECT_TRUE(silent) << daemon.log();
  EXPECT_THAT(daemon.log(), HasSubstr("has not written a chunk"));
  daemon.Kill();
}

TEST(SupervisionTest, SigtermPastTheStopTimeoutLeavesTheShardStaged) {
  testing::DaemonProcess daemon({"--fault-injection", "--stop-timeout", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  // 32 MiB at 4 MiB/s: persisting takes 8 s, the stop allows 1.
  ASSERT_TRUE(SlowDisk(daemon.socket(), 4 << 20).ok());
  std::vector<uint32_t> saved;
  {
    Rank rank(daemon.socket(), 8 << 20);
    ASSERT_TRUE(rank.ckpt);
    saved = rank.w;
    auto save = rank.ckpt->SaveAsync(1);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitStaged().ok());
  }
  absl::SleepFor(absl::Milliseconds(500));
  const absl::Time stop = absl::Now();
  EXPECT_EQ(daemon.Stop(), 0) << daemon.log();
  EXPECT_LT(absl::Now() - stop, absl::Seconds(30)) << daemon.log();
  EXPECT_THAT(daemon.log(), HasSubstr("stopping them"));
  EXPECT_THAT(daemon.log(), HasSubstr("the shard stays staged"));
  // Nothing half-written is left: no shard, no temporary file.
  for (const auto& e :
       std::filesystem::recursive_directory_iterator(daemon.data_dir())) {
    EXPECT_THAT(e.path().string(), ::testing::Not(HasSubstr(".shard")))
        << "left behind by the stopped persist";
  }
  // The next start persists the staged shard at full speed.
  daemon.set_extra_args({});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Rank rank(daemon.socket(), 8 << 20);
  ASSERT_TRUE(rank.ckpt);
  absl::StatusOr<absl::optional<uint64_t>> latest;
  for (int i = 0; i < 600; ++i) {
    latest = rank.ckpt->LatestCommitted(proto::TIER_LOCAL_DISK);
    if (latest.ok() && latest->has_value()) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(latest.ok() && latest->has_value()) << daemon.log();
  EXPECT_EQ(**latest, 1u);
  std::fill(rank.w.begin(), rank.w.end(), 0);
  ASSERT_TRUE(rank.ckpt->Restore(1).ok());
  EXPECT_TRUE(rank.w == saved);
}

}  // namespace
}  // namespace ckpt::client
