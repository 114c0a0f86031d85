#include "daemon/publish/subscriptions.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "daemon/peer/peer_fetch.h"
#include "daemon/publish/fanout.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/names.h"
#include "snapshot/shard_check.h"

namespace ckpt::daemon {
namespace {

// Passes over every source this many times before a version is given up
// (the next round begins it again).
constexpr int kRounds = 3;
// How often a subscriber's record is put again though nothing changed.
constexpr absl::Duration kRecordAgain = absl::Seconds(10);

// A source is slow when, over a window, it received more than four times what
// it sent this node, and kSlowSlack more: the bytes pile up in it, so the nodes
// it feeds go at its pace, not their upstream's.
constexpr absl::Duration kSlowWindow = absl::Seconds(1);
constexpr uint64_t kSlowSlack = 4 << 20;

// Watches the source a rank's file is fetched from, a window at a time,
// through GetVersionFileProgress; Check fails once it is slow.
class SlowSourceWatch {
 public:
  SlowSourceWatch(proto::CkptPeer::Stub* stub,
                  const proto::VersionFileRequest& request, std::string node)
      : stub_(stub), request_(request), node_(std::move(node)) {}

  // `at`: the bytes of the file this node has.
  absl::Status Check(uint64_t at) {
    const absl::Time now = absl::Now();
    if (now < next_) return absl::OkStatus();
    next_ = now + kSlowWindow;
    absl::optional<uint64_t> arrived = Probe();
    if (!arrived.has_value()) return absl::OkStatus();  // its fetch judges it
    const bool slow = window_ && *arrived - std::min(*arrived, arrived_) >
                                     4 * (at - at_) + kSlowSlack;
    const absl::Status why = absl::UnavailableError(
        absl::StrCat("node ", node_, " is slow: it received ",
                     (*arrived - std::min(*arrived, arrived_)) >> 20,
                     " MiB in the last ", absl::FormatDuration(kSlowWindow),
                     " and sent this node ", (at - at_) >> 20, " MiB"));
    window_ = true;
    arrived_ = *arrived;
    at_ = at;
    return slow ? why : absl::OkStatus();
  }

 private:
  absl::optional<uint64_t> Probe() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kSlowWindow));
    proto::VersionFileProgress progress;
    if (!stub_->GetVersionFileProgress(&context, request_, &progress).ok()) {
      return absl::nullopt;
    }
    return progress.arrived();
  }

  proto::CkptPeer::Stub* const stub_;
  const proto::VersionFileRequest request_;
  const std::string node_;
  absl::Time next_ = absl::InfinitePast();
  bool window_ = false;  // arrived_ and at_ are a window's start
  uint64_t arrived_ = 0;
  uint64_t at_ = 0;
};

}  // namespace

// One version received: each rank's file fetched from the first source that
// delivers it whole and verified.
class Subscriptions::Receiving {
 public:
  using Sources = std::vector<std::pair<std::string, std::string>>;
  Receiving(Subscriptions& subscriptions, Arrival& arrival, Sources sources)
      : s_(subscriptions),
        arrival_(arrival),
        sources_(std::move(sources)),
        what_(absl::StrCat("version ", arrival.record().version(), " of topic ",
                           arrival.record().topic())) {}

  absl::Status Run() {
    if (sources_.empty()) {
      return absl::UnavailableError(absl::StrCat(
          what_, ": no peer to fetch it from (its source node ",
          arrival_.record().source_node(), " publishes no peer address)"));
    }
    for (uint32_t rank = 0; rank < arrival_.record().world_size(); ++rank) {
      RETURN_IF_ERROR(ReceiveRank(rank));
    }
    return absl::OkStatus();
  }

 private:
  // From each source in turn, resuming where the last one stopped.
  absl::Status ReceiveRank(uint32_t rank) {
    absl::Status last;
    for (int round = 0; round < kRounds; ++round) {
      const Sources order = Order();
      for (size_t i = 0; i < order.size(); ++i) {
        const auto& [node, address] = order[i];
        if (s_.stopping_.HasBeenNotified()) {
          return absl::CancelledError(absl::StrCat(what_, ": ckptd stops"));
        }
        // The last source is not left for being slow: there is no other.
        last = FetchFrom(rank, node, address, i + 1 < order.size());
        if (last.ok()) {
          last = Verify(rank);
          if (last.ok()) return absl::OkStatus();
          arrival_.Restart(rank);  // bad bytes: from the start, elsewhere
        }
        s_.metrics_->Add("ckpt_version_refetches_total",
                         {{"topic", arrival_.record().topic()}});
        CKPT_LOG_WARN("{}: rank {} from node {}: {}; trying the next source",
                      what_, rank, node, last.ToString());
      }
      if (s_.stopping_.WaitForNotificationWithTimeout(absl::Milliseconds(500)))
        break;
    }
    return absl::Status(
        last.code(), absl::StrCat(what_, ": rank ", rank, ": no source ",
                                  "delivered it; the last: ", last.message()));
  }

  // The sources in order, those found slow for this version last.
  Sources Order() const {
    Sources order;
    for (bool slow : {false, true}) {
      for (const auto& source : sources_) {
        if ((slow_.count(source.first) != 0) == slow) order.push_back(source);
      }
    }
    return order;
  }

  absl::Status FetchFrom(uint32_t rank, const std::string& node,
                         const std::string& address, bool watch_pace) {
    const uint64_t size = arrival_.SizeOf(rank);
    uint64_t at = arrival_.ArrivedOf(rank);
    if (at == size) return absl::OkStatus();
    proto::VersionFileRequest request;
    request.set_topic(arrival_.record().topic());
    request.set_version(arrival_.record().version());
    request.set_rank(rank);
    request.set_offset(at);
    auto stub = proto::CkptPeer::NewStub(s_.channel_to_(address));
    SlowSourceWatch pace(stub.get(), request, node);
    PeerFileCalls calls;
    calls.offer = [&](grpc::ClientContext* context, proto::ShardOffer* offer) {
      return stub->OfferVersionFile(context, request, offer);
    };
    calls.stream = [&](grpc::ClientContext* context) {
      return stub->FetchVersionFile(context, request);
    };
    auto open = [&](uint64_t) -> absl::StatusOr<FetchSink> {
      FetchSink sink;
      // A piece at a time, so the peers below get each as it arrives.
      sink.space = [&]() -> absl::StatusOr<absl::Span<uint8_t>> {
        if (watch_pace) {
          if (absl::Status paced = pace.Check(at); !paced.ok()) {
            s_.metrics_->Add("ckpt_version_slow_sources_total",
                             {{"topic", arrival_.record().topic()}});
            slow_.insert(node);
            return paced;
          }
        }
        absl::Span<uint8_t> space = arrival_.Space(rank, at);
        return space.subspan(0,
                             std::min<size_t>(space.size(), kFanoutPieceBytes));
      };
      sink.arrived = [&](uint64_t n) {
        at += n;
        arrival_.Arrived(rank, at);
      };
      return sink;
    };
    return FetchFromPeer(
        address, size - at,
        absl::StrCat(what_, ", rank ", rank, " from node ", node), calls, open,
        nullptr, s_.options_.stall);
  }

  // Every chunk's checksum, the manifest's seal, and the manifest the
  // version's record names: checked in the mapping the bytes arrived in, on
  // several threads.
  absl::Status Verify(uint32_t rank) {
    const absl::Span<const uint8_t> bytes = arrival_.Bytes(rank);
    const absl::Status bad = absl::DataLossError(absl::StrCat(
        what_, ": rank ", rank, "'s file is not the one the version names"));
    ASSIGN_OR_RETURN(const proto::ShardManifest manifest,
                     snapshot::CheckShardBytes(bytes, /*every_chunk=*/true,
                                               VerifyThreads()));
    // CheckShardBytes checked the footer: it is there.
    ASSIGN_OR_RETURN(
        const snapshot::Footer footer,
        snapshot::CheckFooter(
            bytes.subspan(bytes.size() - snapshot::kAlignment), bytes.size()));
    const proto::VersionFile& file = arrival_.record().files(rank);
    if (footer.manifest_xxh3 != file.manifest_xxh3() ||
        manifest.rank() != rank) {
      return bad;
    }
    return absl::OkStatus();
  }

  static int VerifyThreads() {
    return static_cast<int>(
        std::clamp(std::thread::hardware_concurrency(), 1u, 8u));
  }

  Subscriptions& s_;
  Arrival& arrival_;
  const Sources sources_;
  const std::string what_;
  std::set<std::string> slow_;  // sources found slow, tried last
};

Subscriptions::Subscriptions(io::FileSystem* fs, Publisher* publisher,
                             Coordinator* coordinator, Metrics* metrics,
                             ChannelTo channel_to, SubscriptionOptions options)
    : fs_(fs),
      publisher_(publisher),
      coordinator_(coordinator),
      metrics_(metrics),
      channel_to_(std::move(channel_to)),
      options_(std::move(options)) {
  metrics_->Declare("ckpt_subscriber_lag_versions", Metrics::Type::kGauge,
                    "A subscribed topic's newest version less the newest "
                    "one this node holds.");
  metrics_->Declare("ckpt_version_slow_sources_total", Metrics::Type::kCounter,
                    "Sources of a version left for being slow: bytes piled "
                    "up in them faster than they sent them here.");
  metrics_->Declare("ckpt_version_refetches_total", Metrics::Type::kCounter,
                    "Files of a version fetched again from another peer: "
                    "the one asked failed, stalled or sent bad bytes.");
}

Subscriptions::~Subscriptions() {
  stopping_.Notify();
  std::map<std::string, std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(threads_);
  }
  for (auto& [topic, thread] : threads) thread.join();
}

absl::StatusOr<bool> Subscriptions::Add(const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  absl::MutexLock lock(&mu_);
  if (threads_.count(topic) != 0) return false;
  threads_.emplace(topic, std::thread([this, topic] { Follow(topic); }));
  CKPT_LOG_INFO("subscriptions: following topic {}", topic);
  return true;
}

bool Subscriptions::Follows(const std::string& topic) const {
  absl::MutexLock lock(&mu_);
  return threads_.count(topic) != 0;
}

void Subscriptions::Follow(const std::string& topic) {
  std::set<uint64_t> recorded;
  absl::Time put = absl::InfinitePast();  // the record, last put
  std::string last_error;
  do {
    // The record lives on the node's lease: put again now and then, so a
    // lease lost and taken again does not leave the node unlisted.
    if (absl::Now() - put > kRecordAgain) recorded = {~uint64_t{0}};
    absl::StatusOr<uint64_t> newest = CatchUp(topic, recorded);
    if (recorded.count(~uint64_t{0}) == 0 && put < absl::Now() - kRecordAgain) {
      put = absl::Now();
    }
    // Each new error once, not every round.
    const absl::Status round = newest.status();
    if (!round.ok() && round.ToString() != last_error) {
      CKPT_LOG_WARN("subscriptions: topic {}: {}", topic, round.ToString());
    }
    last_error = round.ok() ? "" : round.ToString();
    // Caught up: the next version is waited for (etcd: watched) a while at
    // a time, so a stop is not held up. After an error: a pause, then again.
    if (newest.ok() && !stopping_.HasBeenNotified()) {
      (void)coordinator_->WaitForVersionAfter(topic, *newest, options_.watch);
    } else {
      stopping_.WaitForNotificationWithTimeout(options_.poll);
    }
  } while (!stopping_.HasBeenNotified());
}

absl::StatusOr<uint64_t> Subscriptions::CatchUp(const std::string& topic,
                                                std::set<uint64_t>& recorded) {
  ASSIGN_OR_RETURN(absl::optional<proto::VersionRecord> newest,
                   coordinator_->NewestVersion(topic));
  std::set<uint64_t> held = publisher_->Held(topic);
  const uint64_t newest_version = newest.has_value() ? newest->version() : 0;
  const uint64_t newest_held = held.empty() ? 0 : *held.rbegin();
  metrics_->Set("ckpt_subscriber_lag_versions", {{"topic", topic}},
                static_cast<double>(newest_version -
                                    std::min(newest_version, newest_held)));
  if (newest_version > newest_held) {
    RETURN_IF_ERROR(Receive(*newest));
    held = publisher_->Held(topic);
  }
  if (held != recorded) {
    proto::SubscriberRecord record;
    record.set_topic(topic);
    record.set_node(options_.node_id);
    for (uint64_t v : held) record.add_held(v);
    record.set_updated_unix_micros(absl::ToUnixMicros(absl::Now()));
    RETURN_IF_ERROR(coordinator_->PutSubscriber(record));
    recorded = held;
  }
  return std::max(newest_version, held.empty() ? 0 : *held.rbegin());
}

absl::Status Subscriptions::Receive(const proto::VersionRecord& version) {
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(Receiving::Sources sources, SourcesOf(version));
  ASSIGN_OR_RETURN(std::shared_ptr<Arrival> arrival,
                   publisher_->BeginArrival(version));
  absl::Status received = Receiving(*this, *arrival, std::move(sources)).Run();
  if (!received.ok()) {
    publisher_->AbandonArrival(*arrival, received);
    return received;
  }
  RETURN_IF_ERROR(publisher_->PlaceArrival(*arrival));
  CKPT_LOG_INFO(
      "subscriptions: version {} of topic {} ({} bytes) received in {:.1f} "
      "ms",
      version.version(), version.topic(), version.bytes(),
      absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>>
Subscriptions::SourcesOf(const proto::VersionRecord& version) {
  ASSIGN_OR_RETURN(std::vector<proto::SubscriberRecord> subscribers,
                   coordinator_->ListSubscribers(version.topic()));
  FanoutNodes nodes;
  nodes.source = version.source_node();
  for (const proto::SubscriberRecord& s : subscribers) {
    nodes.subscribers.push_back(s.node());
    const auto& held = s.held();
    if (std::find(held.begin(), held.end(), version.version()) != held.end()) {
      nodes.holders.insert(s.node());
    }
  }
  const int degree = options_.degree > 0 ? options_.degree
                                         : AutoDegree(nodes.subscribers.size(),
                                                      version.bytes());
  ASSIGN_OR_RETURN(std::vector<proto::PeerInfo> peers,
                   coordinator_->ListPeers());
  std::map<std::string, std::string> address_of;
  for (const proto::PeerInfo& p : peers) address_of[p.node_id()] = p.address();
  std::vector<std::pair<std::string, std::string>> sources;
  for (const std::string& node : FetchOrder(nodes, options_.node_id, degree)) {
    auto it = address_of.find(node);
    if (it != address_of.end()) sources.emplace_back(node, it->second);
  }
  return sources;
}

}  // namespace ckpt::daemon
