// libckpt against a real ckptd process: save, commit and restore; daemon
// SIGKILL mid-persist; slot reuse; a corrupt memory copy; foreign uids and
// planted symlinks; bad names. Trainer SIGKILLs: trainer_kill_test.cc.
#include "client/checkpointer.h"

#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <random>
#include <thread>
#include <tuple>

#include "client/daemon_admin.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "io/file_system.h"
#include "io/kill_point.h"
#include "proto/daemon.grpc.pb.h"
#include "snapshot/chunk_codec.h"
#include "tests/client/connected_rank.h"
#include "tests/client/daemon_process.h"
#include "tests/daemon/etcd_process.h"
#include "tests/test_util.h"
#include "tests/tools/run_cli.h"

namespace ckpt::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr proto::Tier kDisk = proto::TIER_LOCAL_DISK;
constexpr proto::Tier kMem = proto::TIER_MEMORY;

// One rank's training state: a float tensor (its box of a global vector) and an
// RNG string.
struct Trainer {
  std::vector<float> w;
  std::string rng;
  std::unique_ptr<Checkpointer> ckpt;

  Trainer(const std::string& socket, uint32_t rank, uint32_t world,
          int64_t n = 100000)
      : w(n) {
    ckpt = ConnectRank({"job", rank, world, socket},
                       {w.data(), n * world, n * rank, n, &rng});
    Fill(0, rank);
  }
  void Fill(uint64_t step, uint32_t rank) {
    for (size_t i = 0; i < w.size(); ++i)
      w[i] = static_cast<float>((step * 7 + i + rank) % 1000);
    rng = "rng-" + std::to_string(step) + "-" + std::to_string(rank);
  }
};

absl::Status InjectFaults(const std::string& socket, int write_errno,
                          int fsync_errno) {
  auto stub = proto::CkptDaemon::NewStub(grpc::CreateChannel(
      "unix://" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  proto::InjectFaultsRequest req;
  req.set_write_errno(write_errno);
  req.set_fsync_errno(fsync_errno);
  proto::InjectFaultsResponse resp;
  return FromGrpc(stub->InjectFaults(&context, req, &resp), "InjectFaults");
}

// ckpt-chaos's disk faults: switched on and off in a running daemon, only
// when it was started for it.
TEST(CheckpointerTest, DiskFaultsSwitchedOnAndOffAtRunTime) {
  {
    testing::DaemonProcess plain;
    ASSERT_TRUE(plain.Start()) << plain.log();
    absl::Status refused = InjectFaults(plain.socket(), ENOSPC, 0);
    EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(refused.message(), HasSubstr("--fault-injection"));
  }
  testing::DaemonProcess daemon({"--fault-injection"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  for (auto [write_errno, fsync_errno, what] :
       {std::make_tuple(ENOSPC, 0, "No space left"),
        std::make_tuple(0, EIO, "fsync")}) {
    static uint64_t step = 0;
    ASSERT_TRUE(InjectFaults(daemon.socket(), write_errno, fsync_errno).ok());
    auto failing = t.ckpt->SaveAsync(++step);
    ASSERT_TRUE(failing.ok()) << failing.status();
    // Staged and committed in memory; the disk refuses it.
    ASSERT_TRUE((*failing)->WaitCommitted(kMem).ok());
    absl::Status persisted = (*failing)->WaitCommitted(kDisk);
    EXPECT_FALSE(persisted.ok());
    EXPECT_THAT(persisted.message(), HasSubstr(what));
    // The memory tier still holds the step: it restores from there.
    const std::vector<float> staged = t.w;
    t.Fill(77, 0);
    absl::Status from_memory = t.ckpt->Restore(step);
    ASSERT_TRUE(from_memory.ok()) << from_memory;
    EXPECT_EQ(t.w, staged);
    ASSERT_TRUE(InjectFaults(daemon.socket(), 0, 0).ok());
    t.Fill(++step, 0);
    auto fine = t.ckpt->SaveAsync(step);
    ASSERT_TRUE(fine.ok()) << fine.status();
    ASSERT_TRUE((*fine)->WaitCommitted(kDisk).ok());
    std::vector<float> saved = t.w;
    t.Fill(99, 0);
    ASSERT_TRUE(t.ckpt->Restore(step).ok());
    EXPECT_EQ(t.w, saved);
  }
}

// ckptd on the etcd backend: saves commit through etcd; a daemon paused
// (SIGSTOP) past its lease is fenced, then rejoins and commits again, and what
// was committed before stays.
TEST(CheckpointerTest, EtcdBackedDaemonCommitsAndRejoinsAfterAPause) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  std::vector<std::string> args = etcd.DaemonArgs();
  args.insert(args.end(), {"--lease-ttl", "2", "--node-id", "node-1"});
  testing::DaemonProcess daemon(args);
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  t.Fill(1, 0);
  auto first = t.ckpt->SaveAsync(1);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE((*first)->WaitCommitted(kDisk).ok()) << daemon.log();
  const std::vector<float> step1 = t.w;
  daemon.Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::seconds(5));  // past the lease
  daemon.Signal(SIGCONT);
  // Saves go on; once the daemon has rejoined, they commit again.
  bool committed = false;
  for (uint64_t step = 2; step < 200 && !committed; ++step) {
    t.Fill(step, 0);
    auto save = t.ckpt->SaveAsync(step);
    if (save.ok()) committed = (*save)->WaitCommitted(kDisk).ok();
    if (!committed) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(committed) << daemon.log();
  EXPECT_THAT(daemon.log(), HasSubstr("lost its etcd lease"));
  EXPECT_THAT(daemon.log(), HasSubstr("rejoined"));
  t.Fill(999, 0);
  ASSERT_TRUE(t.ckpt->Restore(1).ok());
  EXPECT_EQ(t.w, step1);
}

// Failure notification: two nodes on etcd; node b's daemon is SIGKILLed and
// the trainer on node a is told (callback and LostNodes) once etcd expires
// b's lease.
TEST(CheckpointerTest, ANodeKilledIsReportedToTheSurvivors) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    std::vector<std::string> args = etcd.DaemonArgs();
    args.insert(args.end(), {"--lease-ttl", "2", "--node-id", id});
    return args;
  };
  testing::DaemonProcess a(node("node-a"));
  testing::DaemonProcess b(node("node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  Trainer t(a.socket(), 0, 2);
  ASSERT_TRUE(t.ckpt);
  absl::Mutex mu;
  std::vector<std::string> told;
  ASSERT_TRUE(t.ckpt
                  ->WatchFailures([&](const std::vector<std::string>& lost) {
                    absl::MutexLock lock(&mu);
                    told.insert(told.end(), lost.begin(), lost.end());
                  })
                  .ok());
  EXPECT_EQ(t.ckpt->WatchFailures(nullptr).code(),
            absl::StatusCode::kAlreadyExists);
  const auto killed = std::chrono::steady_clock::now();
  b.Kill();
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(mu.AwaitWithTimeout(
        absl::Condition(
            +[](std::vector<std::string>* v) { return !v->empty(); }, &told),
        absl::Seconds(30)));
    EXPECT_THAT(told, ::testing::ElementsAre("node-b"));
  }
  std::cout << "node-b's loss seen after "
            << std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                             killed)
                   .count()
            << " s (lease TTL 2 s)\n";
  EXPECT_THAT(t.ckpt->LostNodes(), ::testing::ElementsAre("node-b"));
}

// A socket path relative to the working directory reaches the daemon from
// libckpt and from `ckpt`, as an absolute one does.
TEST(CheckpointerTest, ARelativeSocketPathReachesTheDaemon) {
  testing::TempDir dir;
  testing::DaemonProcess daemon;
  daemon.UseSocket(dir.File("run/c.sock"));
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir.path().c_str()), 0);
  Trainer t("run/c.sock", 0, 1, 1000);
  const bool connected = t.ckpt != nullptr;
  absl::Status saved = absl::UnknownError("not connected");
  if (connected) {
    auto save = t.ckpt->SaveAsync(1);
    saved = save.ok() ? (*save)->WaitCommitted(kDisk) : save.status();
  }
  Result ls = RunCli("--socket run/c.sock ls");
  ASSERT_EQ(::chdir(cwd), 0);
  ASSERT_TRUE(connected);
  EXPECT_TRUE(saved.ok()) << saved;
  EXPECT_EQ(ls.exit_code, 0) << ls.out;
  EXPECT_THAT(ls.out, HasSubstr("job"));
  EXPECT_THAT(ls.out, Not(HasSubstr("secure client channel")));
}

TEST(CheckpointerTest, SaveCommitAndRestoreThroughTheDaemon) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer a(daemon.socket(), 0, 2), b(daemon.socket(), 1, 2);
  ASSERT_TRUE(a.ckpt && b.ckpt);
  a.Fill(5, 0);
  b.Fill(5, 1);
  auto sa = a.ckpt->SaveAsync(5);
  auto sb = b.ckpt->SaveAsync(5);
  ASSERT_TRUE(sa.ok() && sb.ok()) << sa.status() << sb.status();
  ASSERT_TRUE((*sa)->WaitStaged().ok());
  ASSERT_TRUE((*sb)->WaitStaged().ok());
  const std::vector<float> saved = a.w;
  const std::string saved_rng = a.rng;
  a.Fill(6, 0);  // training goes on and changes the state
  ASSERT_TRUE((*sa)->WaitCommitted(kDisk).ok());
  ASSERT_TRUE((*sb)->WaitCommitted(kMem).ok());
  EXPECT_EQ(*a.ckpt->LatestCommitted(kDisk).value(), 5u);
  ASSERT_TRUE(a.ckpt->Restore(5).ok());
  EXPECT_EQ(a.w, saved);
  EXPECT_EQ(a.rng, saved_rng);
  EXPECT_EQ(daemon.Stop(), 0) << "clean shutdown on SIGTERM";
}

// chaos three_node (a power loss, then the check of the newest shared step):
// ckptd named the step's copies on this node, and retention dropped them
// before the restore read them (the shared tier keeps the step). The restore
// asks ckptd again, which now names the shared tier's copy.
TEST(CheckpointerTest, CopiesDroppedWhileARestoreReadsThemAreAskedForAgain) {
  testing::TempDir shared;
  // Full saves (no XOR deltas): retention keeping one step drops the others.
  testing::DaemonProcess daemon(
      {"--shared-dir", shared.path(), "--shared-every", "2", "--keep-shared",
       "2", "--keep-disk", "3", "--keep-memory", "3", "--xor-deltas", "false"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  std::vector<float> saved;
  for (uint64_t step = 1; step <= 4; ++step) {
    t.Fill(step, 0);
    if (step == 2) saved = t.w;
    auto save = t.ckpt->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok());
  }
  auto reader = Checkpointer::Connect({.job = "job",
                                       .rank = 0,
                                       .world_size = 1,
                                       .socket_path = daemon.socket(),
                                       .read_only = true});
  ASSERT_TRUE(reader.ok()) << reader.status();
  for (int i = 0; i < 100; ++i) {
    auto shared_latest = (*reader)->LatestCommitted(proto::TIER_SHARED);
    if (shared_latest.ok() && shared_latest->has_value() &&
        **shared_latest == 4) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  std::vector<float> w(t.w.size());
  std::string rng;
  ASSERT_TRUE((*reader)
                  ->RegisterTensor("model/w", proto::DTYPE_FLOAT32, w.data(),
                                   {static_cast<int64_t>(w.size())}, {0},
                                   {static_cast<int64_t>(w.size())})
                  .ok());
  ASSERT_TRUE((*reader)->RegisterBytes("rng", &rng).ok());
  // Once ckptd named step 2's slot and file, retention keeping one step
  // drops them (step 2 stays in the shared tier).
  int described = 0;
  io::SetKillPointCallback([&](absl::string_view point) {
    if (point != "client.shard_described" || described++ > 0) return;
    proto::CollectGarbageRequest gc;
    gc.set_job("job");
    gc.set_keep_disk(1);
    gc.set_keep_memory(1);
    auto dropped = CollectGarbage(daemon.socket(), gc);
    EXPECT_TRUE(dropped.ok()) << dropped.status();
    EXPECT_FALSE(dropped.ok() && dropped->dropped().empty());
  });
  absl::Status restored = (*reader)->Restore(2);
  io::SetKillPointCallback(nullptr);
  ASSERT_TRUE(restored.ok()) << restored;
  EXPECT_GE(described, 2) << "ckptd was asked again";
  EXPECT_EQ(w, saved);
  EXPECT_EQ(rng, "rng-2-0");
}

TEST(CheckpointerTest, ASteadyJobMapsEachSlotOnce) {
  // keep-memory 1: every commit releases the slot before last, which the
  // daemon keeps and renames into place for a later save of the same size.
  testing::DaemonProcess daemon({"--keep-memory", "1", "--keep-disk", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  constexpr uint64_t kSaves = 12;
  for (uint64_t step = 1; step <= kSaves; ++step) {
    t.Fill(step, 0);
    auto save = t.ckpt->SaveAsync(step);
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok());
  }
  CheckpointerStats stats = t.ckpt->stats();
  EXPECT_EQ(stats.slots_mapped + stats.slots_reused, kSaves);
  EXPECT_LE(stats.slots_mapped, 4u) << "slots are reused, and so are mappings";
  EXPECT_GE(stats.slots_reused, kSaves - 4);
  // Reused mappings hold the bytes of this save, not of an older one.
  Trainer expected(daemon.socket(), 0, 1);
  expected.Fill(kSaves, 0);
  t.Fill(0, 0);
  ASSERT_TRUE(t.ckpt->Restore(kSaves).ok());
  EXPECT_EQ(t.w, expected.w);
}

TEST(CheckpointerTest, ACorruptMemoryCopyFallsBackToTheVerifiedFile) {
  testing::DaemonProcess daemon({"--keep-memory", "2"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  t.Fill(3, 0);
  const std::vector<float> saved = t.w;
  auto save = t.ckpt->SaveAsync(3);
  ASSERT_TRUE(save.ok());
  ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok());
  auto shard = t.ckpt->DescribeShard(3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_FALSE(shard->slot_path().empty()) << "still in the memory tier";
  // A bit flips in the tmpfs copy (a bad DIMM, a stray write).
  {
    auto slot = io::DefaultFileSystem()->MapFile(shard->slot_path(), {});
    ASSERT_TRUE(slot.ok()) << slot.status();
    (*slot)->data()[shard->items(0).slot_offset() + 1234] ^= 0x10;
  }
  t.Fill(99, 0);
  ASSERT_TRUE(t.ckpt->Restore(3).ok());
  EXPECT_EQ(t.w, saved) << "restored from the shard file, not the bad slot";
}

// The saving client hashes each chunk of its slot once the copy is in it: the
// hashes travel with the staged items (the persist of a raw chunk then only
// writes), and before the step is persisted they are what a restore from the
// memory tier checks its copy against.
TEST(CheckpointerTest, ChunksHashedByTheSaverGuardTheMemoryCopy) {
  testing::DaemonProcess daemon({"--fault-injection"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  // 9 MiB: chunks of 4, 4 and 1 MiB.
  Trainer t(daemon.socket(), 0, 1, int64_t{9} << 18);
  ASSERT_TRUE(t.ckpt);
  ASSERT_TRUE(InjectFaults(daemon.socket(), ENOSPC, 0).ok());  // memory only
  t.Fill(5, 0);
  const std::vector<float> saved = t.w;
  auto save = t.ckpt->SaveAsync(5);
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE((*save)->WaitCommitted(kMem).ok());
  auto shard = t.ckpt->DescribeShard(5);
  ASSERT_TRUE(shard.ok()) << shard.status();
  ASSERT_TRUE(shard->shard_path().empty()) << "not persisted";
  ASSERT_EQ(shard->items_size(), 2);
  const proto::StagedItem& w = shard->items(0);
  ASSERT_EQ(w.item().name(), "model/w");
  ASSERT_EQ(w.chunk_size(), 4u << 20);
  ASSERT_EQ(w.chunk_xxh3_size(), 3);
  const auto* bytes = reinterpret_cast<const uint8_t*>(saved.data());
  for (int c = 0; c < 3; ++c) {
    const uint64_t off = static_cast<uint64_t>(c) << 22;
    const uint64_t n =
        std::min<uint64_t>(uint64_t{4} << 20, saved.size() * 4 - off);
    EXPECT_EQ(w.chunk_xxh3(c),
              snapshot::Checksum(absl::MakeConstSpan(bytes + off, n)))
        << "chunk " << c;
  }
  EXPECT_EQ(shard->items(1).chunk_xxh3_size(), 1) << "byte items too";
  t.Fill(77, 0);
  ASSERT_TRUE(t.ckpt->Restore(5).ok());
  EXPECT_EQ(t.w, saved);
  // A bit flips in the slot's second chunk: with no shard file to fall back
  // to, the restore says so instead of handing the trainer bad state.
  {
    auto slot = io::DefaultFileSystem()->MapFile(shard->slot_path(), {});
    ASSERT_TRUE(slot.ok()) << slot.status();
    (*slot)->data()[w.slot_offset() + (uint64_t{5} << 20)] ^= 0x10;
  }
  absl::Status bad = t.ckpt->Restore(5);
  EXPECT_EQ(bad.code(), absl::StatusCode::kDataLoss) << bad;
  EXPECT_THAT(bad.message(), HasSubstr("chunk 1"));
  EXPECT_THAT(bad.message(), HasSubstr("hash taken when it was saved"));
}

TEST(CheckpointerTest, RestoresFromDiskOnceTheMemoryCopyIsGone) {
  // Full saves (no XOR deltas, which would keep step 1 as the base of 2).
  testing::DaemonProcess daemon(
      {"--keep-memory", "1", "--keep-disk", "2", "--xor-deltas", "false"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1);
  ASSERT_TRUE(t.ckpt);
  for (uint64_t step = 1; step <= 3; ++step) {
    t.Fill(step, 0);
    auto save = t.ckpt->SaveAsync(step);
    ASSERT_TRUE(save.ok());
    ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok());
  }
  Trainer expected(daemon.socket(), 0, 1);
  expected.Fill(2, 0);
  t.Fill(99, 0);
  ASSERT_TRUE(t.ckpt->Restore(2).ok());
  EXPECT_EQ(t.w, expected.w);
  EXPECT_EQ(t.rng, expected.rng);
  EXPECT_EQ(t.ckpt->Restore(1).code(), absl::StatusCode::kNotFound)
      << "retention dropped it";
}

TEST(CheckpointerTest, DaemonKilledMidPersistFinishesAfterRestart) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  {
    Trainer t(daemon.socket(), 0, 1,
              4 << 20);  // 16 MiB: persisting takes a while
    ASSERT_TRUE(t.ckpt);
    t.Fill(1, 0);
    auto save = t.ckpt->SaveAsync(1);
    ASSERT_TRUE(save.ok());
    // Committed in memory: the daemon owns the slot; its persist may be
    // anywhere.
    ASSERT_TRUE((*save)->WaitCommitted(kMem).ok());
    daemon.Kill();
  }
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1, 4 << 20);
  ASSERT_TRUE(t.ckpt);
  auto wait = [&] {
    for (int i = 0; i < 200; ++i) {
      auto latest = t.ckpt->LatestCommitted(kDisk);
      if (latest.ok() && latest->has_value()) return **latest;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return uint64_t{0};
  };
  EXPECT_EQ(wait(), 1u);
  Trainer expected(daemon.socket(), 0, 1, 4 << 20);
  expected.Fill(1, 0);
  ASSERT_TRUE(t.ckpt->Restore(1).ok());
  EXPECT_EQ(t.w, expected.w);
}

// A daemon that starts with its memory budget full of slots retention no
// longer keeps (here: restarted with a smaller --keep-memory) collects them
// before the first save needs the room; nothing else would (no persist is
// pending), and the job's saves would be refused, or wait, forever.
TEST(CheckpointerTest, ARestartFreesTheMemoryRetentionNoLongerKeeps) {
  constexpr int64_t kFloats = 100000;
  // A slot: the tensor and the RNG item, each at a 64-byte aligned offset.
  constexpr uint64_t kSlot = kFloats * 4 + 64;
  const std::string budget = std::to_string(4 * kSlot + 1000);  // 4 slots
  testing::DaemonProcess daemon({"--memory-budget", budget, "--full-policy",
                                 "skip", "--keep-memory", "4", "--keep-disk",
                                 "5"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  {
    Trainer t(daemon.socket(), 0, 1, kFloats);
    ASSERT_TRUE(t.ckpt);
    for (uint64_t step = 1; step <= 4; ++step) {
      t.Fill(step, 0);
      auto save = t.ckpt->SaveAsync(step);
      ASSERT_TRUE(save.ok()) << save.status();
      ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok()) << daemon.log();
    }
    // Four kept slots fill the budget. --keep-memory is a wish under
    // pressure: the fifth save takes the memory of the oldest step, which is
    // safe on disk, and that step still restores, from disk.
    t.Fill(5, 0);
    auto fifth = t.ckpt->SaveAsync(5);
    ASSERT_TRUE(fifth.ok()) << fifth.status() << daemon.log();
    ASSERT_TRUE((*fifth)->WaitCommitted(kDisk).ok()) << daemon.log();
    Trainer expected(daemon.socket(), 0, 1, kFloats);
    expected.Fill(1, 0);
    absl::Status restored = t.ckpt->Restore(1);
    ASSERT_TRUE(restored.ok()) << restored << daemon.log();
    EXPECT_EQ(t.w, expected.w);
    auto metrics = GetMetricsText(daemon.socket());
    ASSERT_TRUE(metrics.ok()) << metrics.status();
    EXPECT_THAT(*metrics, HasSubstr("ckpt_memory_evictions_total{job=\"job\","
                                    "reason=\"older_step\"} 1"));
  }
  daemon.Kill();
  daemon.set_extra_args({"--memory-budget", budget, "--full-policy", "wait",
                         "--keep-memory", "1", "--keep-disk", "1"});
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  Trainer t(daemon.socket(), 0, 1, kFloats);
  ASSERT_TRUE(t.ckpt);
  t.Fill(6, 0);
  auto save = t.ckpt->SaveAsync(6);
  ASSERT_TRUE(save.ok()) << save.status() << daemon.log();
  ASSERT_TRUE((*save)->WaitCommitted(kDisk).ok()) << daemon.log();
  Trainer expected(daemon.socket(), 0, 1, kFloats);
  expected.Fill(6, 0);
  ASSERT_TRUE(t.ckpt->Restore(6).ok());
  EXPECT_EQ(t.w, expected.w);
  // The restart's garbage collection made the room, not evictions.
  auto metrics = GetMetricsText(daemon.socket());
  ASSERT_TRUE(metrics.ok()) << metrics.status();
  EXPECT_THAT(*metrics, Not(HasSubstr("ckpt_memory_evictions_total{")));
}

TEST(CheckpointerTest, AConnectionFromAnotherUidIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root to act as another uid";
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  // Open the directory and socket so the kernel lets uid 65534 reach the daemon
  // at all.
  ASSERT_EQ(::chmod(ckpt::io::DirName(daemon.socket()).c_str(), 0755), 0);
  ASSERT_EQ(::chmod(daemon.socket().c_str(), 0666), 0);
  ASSERT_EQ(::chmod(daemon.dir().path().c_str(), 0755), 0);
  pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    auto refused = Checkpointer::Connect({"job", 0, 1, daemon.socket()});
    if (refused.ok()) ::_exit(11);
    if (refused.status().code() != absl::StatusCode::kPermissionDenied)
      ::_exit(12);
    // Past the library's own check: a raw connection must be dropped by the
    // daemon.
    int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, daemon.socket().c_str(),
                 sizeof(addr.sun_path) - 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0)
      ::_exit(13);
    char buf[16];
    ssize_t n = ::read(fd, buf, sizeof buf);  // EOF: the daemon closed it
    ::_exit(n == 0 ? 0 : 14);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_THAT(daemon.log(), HasSubstr("refused a connection from uid 65534"));
  // The owner still gets in.
  Trainer t(daemon.socket(), 0, 1, 10);
  EXPECT_TRUE(t.ckpt != nullptr);
}

TEST(CheckpointerTest, APlantedSymlinkAtTheSocketPathIsNotFollowed) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(ckpt::io::DefaultFileSystem()
                  ->CreateDirs(ckpt::io::DirName(daemon.socket()))
                  .ok());
  testing::WriteAll(daemon.dir().File("victim"), "precious");
  ASSERT_EQ(
      ::symlink(daemon.dir().File("victim").c_str(), daemon.socket().c_str()),
      0);
  EXPECT_FALSE(daemon.Start());
  EXPECT_THAT(daemon.log(), HasSubstr("is not a socket (a symlink)"));
  EXPECT_EQ(testing::ReadAll(daemon.dir().File("victim")), "precious");
}

TEST(CheckpointerTest, BadNamesAreRefusedWithClearErrors) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  EXPECT_THAT(Checkpointer::Connect({"../escape", 0, 1, daemon.socket()})
                  .status()
                  .message(),
              HasSubstr("job id"));
  EXPECT_THAT(
      Checkpointer::Connect({std::string("j\0b", 3), 0, 1, daemon.socket()})
          .status()
          .message(),
      HasSubstr("\\x00"));
  EXPECT_THAT(
      Checkpointer::Connect({"job", 3, 2, daemon.socket()}).status().message(),
      HasSubstr("outside world size"));
  Trainer t(daemon.socket(), 0, 1, 10);
  ASSERT_TRUE(t.ckpt);
  std::vector<float> x(4);
  EXPECT_THAT(t.ckpt
                  ->RegisterTensor("a/../b", proto::DTYPE_FLOAT32, x.data(),
                                   {4}, {0}, {4})
                  .message(),
              HasSubstr("'..'"));
  EXPECT_THAT(t.ckpt
                  ->RegisterTensor(std::string(2000, 'n'), proto::DTYPE_FLOAT32,
                                   x.data(), {4}, {0}, {4})
                  .message(),
              HasSubstr("limit is 1024"));
  auto missing =
      Checkpointer::Connect({"job", 0, 1, daemon.dir().File("nope.sock")});
  EXPECT_THAT(missing.status().message(), HasSubstr("is ckptd running"));
}

}  // namespace
}  // namespace ckpt::client
