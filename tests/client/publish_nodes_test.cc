// Publication across nodes (issue #37), real ckptd processes on loopback with
// a real etcd: subscriber nodes receive each version through the fan-out
// (a chain: the source sends it once; a tree of degree 2), bit-exact; a
// subscriber SIGKILLed mid-transfer does not hold the others back and catches
// up from a peer when it returns; with the source lost, a late joiner gets the
// version from the subscribers; a corrupt copy is fetched again elsewhere and
// never readable; a reader holding a version keeps it while newer ones arrive;
// a slow (not stalled) node is routed around; a step of a job on two nodes is
// published from either.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/daemon_admin.h"
#include "client/subscriber.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/client/daemon_process.h"
#include "tests/client/peer_ranks.h"
#include "tests/daemon/etcd_process.h"

namespace ckpt::client {
namespace {

constexpr int64_t kGlobal = 1 << 21;  // floats: 4 MiB per rank of 2

// The sum of a metric's samples whose labels contain `label`.
double Metric(const testing::DaemonProcess& node, const std::string& name,
              const std::string& label = "") {
  absl::StatusOr<std::string> text = GetMetricsText(node.socket());
  if (!text.ok()) return -1;
  double sum = 0;
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (!absl::StartsWith(line, name + "{") &&
        !absl::StartsWith(line, name + " "))
      continue;
    if (!label.empty() && !absl::StrContains(line, label)) continue;
    double v = 0;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) sum += v;
  }
  return sum;
}

// Subscribers of the topic as the source's ckptd lists them.
size_t SubscribersOf(const testing::DaemonProcess& node,
                     const std::string& topic) {
  absl::StatusOr<proto::ListTopicsResponse> topics = ListTopics(node.socket());
  if (!topics.ok()) return 0;
  for (const proto::TopicSummary& t : topics->topics()) {
    if (t.topic() == topic) return static_cast<size_t>(t.subscribers_size());
  }
  return 0;
}

class PublishNodesTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(etcd_.Start()) << etcd_.log(); }

  // A subscriber node's arguments.
  std::vector<std::string> Subscriber(const std::string& node,
                                      std::vector<std::string> more = {}) {
    more.insert(more.begin(), {"--subscribe", "policy"});
    return NodeArgs(etcd_, node, more);
  }
  // Saves `step` on both ranks (on the source) and publishes it.
  absl::StatusOr<proto::VersionRecord> SaveAndPublish(
      testing::DaemonProcess& source, Rank& r0, Rank& r1, uint64_t step) {
    absl::Status saved = SaveAll({&r0, &r1}, step, proto::TIER_LOCAL_DISK);
    if (!saved.ok()) return saved;
    return Publish(source.socket(), Request(step));
  }
  // Publishes the model of `step` as a version of "policy".
  static proto::PublishRequest Request(uint64_t step) {
    proto::PublishRequest request;
    request.set_job("pub");
    request.set_step(step);
    request.set_topic("policy");
    request.add_items("model/*");
    return request;
  }
  // Waits for version `version` on `node` and checks it holds step `step`'s
  // values, bit for bit.
  void ExpectVersion(const testing::DaemonProcess& node, uint64_t version,
                     uint64_t step, absl::Duration timeout = absl::Seconds(90),
                     int64_t global = kGlobal) {
    auto subscriber = Subscriber::Connect(node.socket(), "policy");
    ASSERT_TRUE(subscriber.ok()) << subscriber.status();
    auto seen = (*subscriber)->WaitForVersion(version - 1, timeout);
    ASSERT_TRUE(seen.ok()) << seen.status() << "\n" << node.log();
    ASSERT_GE(seen->version(), version);
    auto opened = (*subscriber)->Open(version);
    ASSERT_TRUE(opened.ok()) << opened.status();
    std::vector<float> w(global);
    absl::Status read = (*opened)->Read(
        "model/w", {reinterpret_cast<uint8_t*>(w.data()), w.size() * 4});
    ASSERT_TRUE(read.ok()) << read;
    for (int64_t g = 0; g < global; ++g) {
      ASSERT_EQ(w[g], Value(step, g)) << "at " << g;
    }
  }
  void WaitForSubscribers(const testing::DaemonProcess& source, size_t n) {
    for (int i = 0; i < 600 && SubscribersOf(source, "policy") < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ASSERT_GE(SubscribersOf(source, "policy"), n);
  }

  testing::EtcdProcess etcd_;
};

TEST_F(PublishNodesTest, AChainSendsEachVersionOnceFromTheSourceBitExact) {
  testing::DaemonProcess a(NodeArgs(etcd_, "node-a"));
  testing::DaemonProcess b(Subscriber("node-b", {"--fanout-degree", "1"})),
      c(Subscriber("node-c", {"--fanout-degree", "1"})),
      d(Subscriber("node-d", {"--fanout-degree", "1", "--keep-versions", "1"}));
  for (auto* n : {&a, &b, &c, &d}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 3);
  Rank r0(a.socket(), "pub", 0, 2, kGlobal),
      r1(a.socket(), "pub", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  auto v1 = SaveAndPublish(a, r0, r1, 1);
  ASSERT_TRUE(v1.ok()) << v1.status() << a.log();
  for (auto* n : {&b, &c, &d}) ExpectVersion(*n, 1, 1);
  // The chain a -> b -> c -> d: each node sent the version once, the last
  // none.
  const double bytes = static_cast<double>(v1->bytes());
  EXPECT_EQ(Metric(a, "ckpt_version_bytes_served_total"), bytes) << b.log();
  EXPECT_EQ(Metric(b, "ckpt_version_bytes_served_total"), bytes) << c.log();
  EXPECT_EQ(Metric(c, "ckpt_version_bytes_served_total"), bytes) << d.log();
  EXPECT_EQ(Metric(d, "ckpt_version_bytes_served_total"), 0);
  EXPECT_EQ(Metric(d, "ckpt_received_versions_total"), 1);

  // A reader on d holds version 1 while 2 and 3 arrive (d keeps one).
  auto subscriber = Subscriber::Connect(d.socket(), "policy");
  ASSERT_TRUE(subscriber.ok());
  auto held = (*subscriber)->Open(1);
  ASSERT_TRUE(held.ok()) << held.status();
  for (uint64_t step = 2; step <= 3; ++step) {
    ASSERT_TRUE(SaveAndPublish(a, r0, r1, step).ok());
    ExpectVersion(d, step, step);
  }
  std::vector<float> w(kGlobal);
  ASSERT_TRUE((*held)
                  ->Read("model/w",
                         {reinterpret_cast<uint8_t*>(w.data()), w.size() * 4})
                  .ok());
  for (int64_t g = 0; g < kGlobal; g += 4099) ASSERT_EQ(w[g], Value(1, g));
  // d keeps version 1 while its reader holds it, beside the newest; once
  // the reader lets go, the next version placed drops it.
  EXPECT_TRUE((*subscriber)->Open(1).ok());
  held->reset();
  ASSERT_TRUE(SaveAndPublish(a, r0, r1, 4).ok());
  ExpectVersion(d, 4, 4);
  EXPECT_TRUE(absl::IsNotFound((*subscriber)->Open(1).status()));
  // ckpt topics' figures: every subscriber at lag 0.
  auto topics = ListTopics(a.socket());
  ASSERT_TRUE(topics.ok());
  for (const proto::SubscriberRecord& s : topics->topics(0).subscribers()) {
    ASSERT_FALSE(s.held().empty()) << s.node();
    EXPECT_EQ(*std::max_element(s.held().begin(), s.held().end()), 4u)
        << s.node();
  }
}

TEST_F(PublishNodesTest, ATreeOfDegreeTwoForwardsToTwoNodesEach) {
  const std::vector<std::string> tree = {"--fanout-degree", "2"};
  testing::DaemonProcess a(NodeArgs(etcd_, "node-a"));
  testing::DaemonProcess b(Subscriber("node-b", tree)),
      c(Subscriber("node-c", tree)), d(Subscriber("node-d", tree));
  for (auto* n : {&a, &b, &c, &d}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 3);
  Rank r0(a.socket(), "pub", 0, 2, kGlobal),
      r1(a.socket(), "pub", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  auto v1 = SaveAndPublish(a, r0, r1, 1);
  ASSERT_TRUE(v1.ok()) << v1.status() << a.log();
  for (auto* n : {&b, &c, &d}) ExpectVersion(*n, 1, 1);
  // a -> (b, c), b -> d.
  const double bytes = static_cast<double>(v1->bytes());
  EXPECT_EQ(Metric(a, "ckpt_version_bytes_served_total"), 2 * bytes);
  EXPECT_EQ(Metric(b, "ckpt_version_bytes_served_total"), bytes);
  EXPECT_EQ(Metric(c, "ckpt_version_bytes_served_total"), 0);
  EXPECT_EQ(Metric(d, "ckpt_version_bytes_served_total"), 0);
}

TEST_F(PublishNodesTest, AKilledSubscriberAndALostSourceHoldNobodyBack) {
  // Sends capped at 4 MiB/s: a version of 8 MiB takes seconds per hop, so
  // the middle node dies mid-transfer.
  const std::vector<std::string> capped = {"--fanout-degree",   "1",
                                           "--peer-send-rate",  "4M",
                                           "--subscribe-stall", "3"};
  testing::DaemonProcess a(
      NodeArgs(etcd_, "node-a", {"--peer-send-rate", "4M"}));
  testing::DaemonProcess b(Subscriber("node-b", capped)),
      c(Subscriber("node-c", capped)), d(Subscriber("node-d", capped));
  for (auto* n : {&a, &b, &c, &d}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 3);
  Rank r0(a.socket(), "pub", 0, 2, kGlobal),
      r1(a.socket(), "pub", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  auto v1 = SaveAndPublish(a, r0, r1, 1);
  ASSERT_TRUE(v1.ok()) << v1.status() << a.log();
  // c, the middle of a -> b -> c -> d, dies once bytes reach it.
  const std::string receiving =
      c.staging_dir() + ".publish/policy/.receiving-1";
  for (int i = 0; i < 2000 && !std::filesystem::exists(receiving); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_TRUE(std::filesystem::exists(receiving)) << c.log();
  c.Kill();
  ExpectVersion(b, 1, 1);
  ExpectVersion(d, 1, 1);
  // d went around c.
  EXPECT_GE(Metric(d, "ckpt_version_refetches_total"), 1) << d.log();
  // c catches up from a peer when it returns.
  ASSERT_TRUE(c.Start()) << c.log();
  ExpectVersion(c, 1, 1);

  // The source lost: a node joining late gets the version from the
  // subscribers.
  a.Kill();
  testing::DaemonProcess e(Subscriber("node-e", capped));
  ASSERT_TRUE(e.Start()) << e.log();
  ExpectVersion(e, 1, 1);
}

// A slow (not stalled) middle node: the bytes pile up in it faster than it
// sends them on, so the node below leaves it for the source, for every rank.
TEST_F(PublishNodesTest, ASlowSubscriberIsRoutedAround) {
  constexpr int64_t kBig = 1 << 24;  // floats: 32 MiB per rank of 2
  testing::DaemonProcess a(
      NodeArgs(etcd_, "node-a", {"--peer-send-rate", "24M"}));
  testing::DaemonProcess b(
      Subscriber("node-b", {"--fanout-degree", "1", "--peer-send-rate", "1M"}));
  testing::DaemonProcess c(Subscriber("node-c", {"--fanout-degree", "1"}));
  for (auto* n : {&a, &b, &c}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 2);
  Rank r0(a.socket(), "pub", 0, 2, kBig), r1(a.socket(), "pub", 1, 2, kBig);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  ASSERT_TRUE(SaveAndPublish(a, r0, r1, 1).ok()) << a.log();
  // c would take a minute at b's pace; it goes to a instead.
  ExpectVersion(c, 1, 1, absl::Seconds(90), kBig);
  EXPECT_GE(Metric(c, "ckpt_version_slow_sources_total"), 1) << c.log();
  EXPECT_THAT(c.log(), ::testing::HasSubstr("node node-b is slow"));
  ExpectVersion(b, 1, 1, absl::Seconds(90), kBig);
}

TEST_F(PublishNodesTest, ACorruptCopyIsFetchedAgainElsewhereNeverReadable) {
  testing::DaemonProcess a(NodeArgs(etcd_, "node-a"));
  testing::DaemonProcess b(Subscriber("node-b", {"--fanout-degree", "1"}));
  for (auto* n : {&a, &b}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 1);
  Rank r0(a.socket(), "pub", 0, 2, kGlobal),
      r1(a.socket(), "pub", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  ASSERT_TRUE(SaveAndPublish(a, r0, r1, 1).ok());
  ExpectVersion(b, 1, 1);
  // b's copy of rank 1's file rots: a byte in the middle of its data.
  const std::string rotten =
      b.staging_dir() + ".publish/policy/00000000000000000001/rank-1.shard";
  {
    std::fstream f(rotten, std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good()) << rotten;
    f.seekg(1 << 20);
    char byte = 0;
    f.read(&byte, 1);
    byte ^= 0x5a;
    f.seekp(1 << 20);
    f.write(&byte, 1);
  }
  // c joins late; b comes first in its order (a chain a -> b -> c), and its
  // bytes do not verify: c fetches rank 1 again, from the source.
  testing::DaemonProcess c(Subscriber("node-c", {"--fanout-degree", "1"}));
  ASSERT_TRUE(c.Start()) << c.log();
  ExpectVersion(c, 1, 1);
  EXPECT_GE(Metric(c, "ckpt_version_refetches_total"), 1) << c.log();
}

// A job on two nodes, no replicas anywhere: the node asked to publish
// fetches the other node's rank from it first; the subscriber gets every
// rank bit-exact, from either source. With the other node gone, the publish
// fails naming the rank it could not get.
TEST_F(PublishNodesTest, AStepOfAJobOnTwoNodesIsPublishedFromEither) {
  auto no_replicas = [](std::vector<std::string> args) {
    auto it = std::find(args.begin(), args.end(), "--peer-replicas");
    *(it + 1) = "0";
    return args;
  };
  testing::DaemonProcess a(no_replicas(NodeArgs(etcd_, "node-a"))),
      b(no_replicas(NodeArgs(etcd_, "node-b"))),
      c(no_replicas(Subscriber("node-c", {"--fanout-degree", "1"})));
  for (auto* n : {&a, &b, &c}) ASSERT_TRUE(n->Start()) << n->log();
  WaitForSubscribers(a, 1);
  Rank r0(a.socket(), "pub", 0, 2, kGlobal),
      r1(b.socket(), "pub", 1, 2, kGlobal);
  ASSERT_TRUE(r0.ckpt && r1.ckpt);
  auto v1 = SaveAndPublish(a, r0, r1, 1);
  ASSERT_TRUE(v1.ok()) << v1.status() << a.log();
  ExpectVersion(c, 1, 1);
  EXPECT_EQ(Metric(a, "ckpt_publish_fetched_shards_total"), 1) << a.log();
  auto v2 = SaveAndPublish(b, r0, r1, 2);
  ASSERT_TRUE(v2.ok()) << v2.status() << b.log();
  EXPECT_EQ(v2->source_node(), "node-b");
  ExpectVersion(c, 2, 2);
  EXPECT_EQ(Metric(b, "ckpt_publish_fetched_shards_total"), 1) << b.log();

  ASSERT_TRUE(SaveAll({&r0, &r1}, 3, proto::TIER_LOCAL_DISK).ok());
  b.Kill();
  auto v3 = Publish(a.socket(), Request(3));
  EXPECT_TRUE(absl::IsFailedPrecondition(v3.status())) << v3.status();
  EXPECT_THAT(v3.status().message(),
              ::testing::HasSubstr("rank 1's shard is not on this node and "
                                   "could not be fetched from a peer"));
}

TEST_F(PublishNodesTest, BadSubscriptionsAreRefusedWithTheReason) {
  // No peer tier: nothing to fetch from.
  testing::DaemonProcess lone({"--subscribe", "policy"});
  EXPECT_FALSE(lone.Start());
  EXPECT_THAT(lone.log(),
              ::testing::HasSubstr("--subscribe needs --peer-address"));
  testing::DaemonProcess bad(Subscriber("node-x", {"--subscribe", "no/such"}));
  EXPECT_FALSE(bad.Start());
  EXPECT_THAT(bad.log(), ::testing::HasSubstr("--subscribe"));
  testing::DaemonProcess rate(
      NodeArgs(etcd_, "node-y", {"--peer-send-rate", "fast"}));
  EXPECT_FALSE(rate.Start());
  EXPECT_THAT(rate.log(), ::testing::HasSubstr("--peer-send-rate \"fast\""));
  // At run time, through ckpt subscribe's call.
  testing::DaemonProcess one;
  ASSERT_TRUE(one.Start()) << one.log();
  absl::StatusOr<bool> added = Subscribe(one.socket(), "policy");
  EXPECT_TRUE(absl::IsFailedPrecondition(added.status())) << added.status();
  EXPECT_THAT(added.status().message(), ::testing::HasSubstr("--peer-address"));
  testing::DaemonProcess peer(NodeArgs(etcd_, "node-z"));
  ASSERT_TRUE(peer.Start()) << peer.log();
  added = Subscribe(peer.socket(), "policy");
  ASSERT_TRUE(added.ok()) << added.status();
  EXPECT_TRUE(*added);
  added = Subscribe(peer.socket(), "policy");
  ASSERT_TRUE(added.ok());
  EXPECT_FALSE(*added);  // already
  EXPECT_FALSE(Subscribe(peer.socket(), "bad topic").ok());
}

}  // namespace
}  // namespace ckpt::client
