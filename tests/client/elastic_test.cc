// Rejoin(): the rendezvous of a job's next epoch through real ckptd processes,
// on the embedded backend (one node) and on a real etcd (two nodes).
#include "client/elastic.h"

#include <set>
#include <thread>
#include <vector>

#include "client/checkpointer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/daemon/etcd_process.h"

namespace ckpt::client {
namespace {

// `participants` call Rejoin at once, each on the daemon at sockets[i %
// sockets.size()].
std::vector<absl::StatusOr<Epoch>> RejoinAll(
    const std::vector<std::string>& sockets,
    const std::vector<std::string>& participants, uint32_t min_ranks,
    uint32_t max_ranks, proto::Tier resume_tier = proto::TIER_PEER) {
  std::vector<absl::StatusOr<Epoch>> out(participants.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < participants.size(); ++i) {
    threads.emplace_back([&, i] {
      out[i] = Rejoin({.job = "elastic",
                       .socket_path = sockets[i % sockets.size()],
                       .participant = participants[i],
                       .min_ranks = min_ranks,
                       .max_ranks = max_ranks,
                       .settle = absl::Milliseconds(500),
                       .timeout = absl::Seconds(30),
                       .resume_tier = resume_tier});
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

// Every participant got the same epoch, its rank in sorted order, and the
// same 128-byte NCCL unique id.
void ExpectOneEpoch(const std::vector<absl::StatusOr<Epoch>>& got,
                    const std::vector<std::string>& participants,
                    uint64_t epoch) {
  std::vector<std::string> sorted = participants;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    EXPECT_EQ(got[i]->epoch, epoch);
    EXPECT_EQ(got[i]->world_size, participants.size());
    EXPECT_EQ(sorted[got[i]->rank], participants[i]);
    EXPECT_EQ(got[i]->nccl_unique_id.size(), 128u);
    EXPECT_EQ(got[i]->nccl_unique_id, got[0]->nccl_unique_id);
    EXPECT_EQ(got[i]->resume_step, got[0]->resume_step);
  }
}

TEST(ElasticTest, RanksOfOneNodeRendezvousEpochAfterEpoch) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  const std::vector<std::string> first = {"p-c", "p-a", "p-b"};
  auto one = RejoinAll({daemon.socket()}, first, 2, 4);
  ExpectOneEpoch(one, first, 1);
  // The job shrinks: two survivors, the epoch closes when both joined.
  const std::vector<std::string> survivors = {"p-a", "p-c"};
  auto two = RejoinAll({daemon.socket()}, survivors, 2, 2);
  ExpectOneEpoch(two, survivors, 2);
  EXPECT_NE((*two[0]).nccl_unique_id, (*one[0]).nccl_unique_id);
  // A latecomer finds epoch 2 closed without it and opens the next one.
  auto late = RejoinAll({daemon.socket()}, {"p-late"}, 1, 1);
  ExpectOneEpoch(late, {"p-late"}, 3);
  // Too few participants: a clear timeout.
  auto alone = Rejoin({.job = "elastic",
                       .socket_path = daemon.socket(),
                       .participant = "p-x",
                       .min_ranks = 2,
                       .max_ranks = 2,
                       .timeout = absl::Seconds(1)});
  EXPECT_EQ(alone.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(alone.status().message(),
              ::testing::HasSubstr("1 of at least 2"));
}

// The epoch fixes the step its members resume from when it closes: the newest
// committed at the asked tier then, the same for every member.
TEST(ElasticTest, EveryMemberResumesFromTheStepCommittedWhenTheEpochClosed) {
  testing::DaemonProcess daemon;
  ASSERT_TRUE(daemon.Start()) << daemon.log();
  auto c = Checkpointer::Connect({"elastic", 0, 1, daemon.socket()});
  ASSERT_TRUE(c.ok()) << c.status();
  std::string bytes = "state";
  ASSERT_TRUE((*c)->RegisterBytes("state", &bytes).ok());
  auto save = [&](uint64_t step) {
    auto h = (*c)->SaveAsync(step);
    ASSERT_TRUE(h.ok()) << h.status();
    ASSERT_TRUE(
        (*h)->WaitCommitted(proto::TIER_MEMORY, absl::Seconds(30)).ok());
  };
  // Nothing committed yet: the epoch starts afresh.
  const std::vector<std::string> members = {"r-a", "r-b"};
  auto fresh = RejoinAll({daemon.socket()}, members, 2, 2, proto::TIER_MEMORY);
  ExpectOneEpoch(fresh, members, 1);
  EXPECT_EQ(fresh[0]->resume_step, absl::nullopt);
  save(7);
  auto second = RejoinAll({daemon.socket()}, members, 2, 2, proto::TIER_MEMORY);
  ExpectOneEpoch(second, members, 2);
  EXPECT_EQ(second[0]->resume_step, absl::optional<uint64_t>(7));
  save(9);
  auto third = RejoinAll({daemon.socket()}, members, 2, 2, proto::TIER_MEMORY);
  ExpectOneEpoch(third, members, 3);
  EXPECT_EQ(third[0]->resume_step, absl::optional<uint64_t>(9));
  // One node has no peer tier: nothing to resume from there.
  auto peer = RejoinAll({daemon.socket()}, members, 2, 2);
  ExpectOneEpoch(peer, members, 4);
  EXPECT_EQ(peer[0]->resume_step, absl::nullopt);
}

TEST(ElasticTest, RanksOnTwoNodesRendezvousThroughEtcd) {
  testing::EtcdProcess etcd;
  ASSERT_TRUE(etcd.Start()) << etcd.log();
  auto node = [&](const std::string& id) {
    std::vector<std::string> args = etcd.DaemonArgs();
    args.insert(args.end(), {"--node-id", id});
    return args;
  };
  testing::DaemonProcess a(node("node-a"));
  testing::DaemonProcess b(node("node-b"));
  ASSERT_TRUE(a.Start()) << a.log();
  ASSERT_TRUE(b.Start()) << b.log();
  const std::vector<std::string> ranks = {"a-0", "b-0", "a-1", "b-1"};
  auto got = RejoinAll({a.socket(), b.socket()}, ranks, 4, 8);
  ExpectOneEpoch(got, ranks, 1);
}

}  // namespace
}  // namespace ckpt::client
