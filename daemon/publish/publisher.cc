#include "daemon/publish/publisher.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/publish/version_maker.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/dtype.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {
namespace {

constexpr char kReceivingPrefix[] = ".receiving-";
// Shards of other nodes fetched at once to publish a step.
constexpr size_t kFetchThreads = 8;

absl::Status ValidateRequest(const proto::PublishRequest& r) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(r.job()));
  RETURN_IF_ERROR(snapshot::ValidateTopic(r.topic()));
  if (!r.cast().empty() && r.cast() != "bf16") {
    return absl::InvalidArgumentError(
        absl::StrCat("cast to \"", r.cast(),
                     "\" is not supported (bf16 is: float32 items become "
                     "bfloat16)"));
  }
  for (const std::string& glob : r.items()) {
    if (glob.empty()) {
      return absl::InvalidArgumentError("an empty --items glob");
    }
  }
  return absl::OkStatus();
}

}  // namespace

Publisher::Publisher(io::FileSystem* fs, PublishOptions options,
                     std::unique_ptr<VersionStore> store,
                     Coordinator* coordinator, Metrics* metrics,
                     LocalShardFile local_file, FetchShardFile fetch_file)
    : fs_(fs),
      options_(std::move(options)),
      store_(std::move(store)),
      coordinator_(coordinator),
      metrics_(metrics),
      local_file_(std::move(local_file)),
      fetch_file_(std::move(fetch_file)) {}

absl::StatusOr<std::unique_ptr<Publisher>> Publisher::Open(
    io::FileSystem* fs, PublishOptions options, Coordinator* coordinator,
    Metrics* metrics, LocalShardFile local_file, FetchShardFile fetch_file) {
  ASSIGN_OR_RETURN(std::unique_ptr<VersionStore> store,
                   VersionStore::Open(fs, {options.dir, options.keep_versions,
                                           options.budget_bytes}));
  metrics->Declare("ckpt_received_versions_total", Metrics::Type::kCounter,
                   "Versions of a topic received here from peers "
                   "(subscriptions), whole and verified.");
  metrics->Declare("ckpt_version_bytes_served_total", Metrics::Type::kCounter,
                   "Bytes of versions this node was asked to send to "
                   "subscribers (the fan-out's load on it).");
  metrics->Declare("ckpt_version_reach_seconds", Metrics::Type::kHistogram,
                   "Time from a version's making to its placing here, on "
                   "a subscriber.",
                   Metrics::SecondsBuckets());
  metrics->Declare("ckpt_published_versions_total", Metrics::Type::kCounter,
                   "Versions of a topic published from this node.");
  metrics->Declare("ckpt_published_bytes_total", Metrics::Type::kCounter,
                   "Bytes of the versions published from this node.");
  metrics->Declare("ckpt_publish_seconds", Metrics::Type::kHistogram,
                   "Time to make a version: reading the step, casting, "
                   "writing its files, numbering it.",
                   Metrics::SecondsBuckets());
  metrics->Declare("ckpt_publish_fetched_shards_total", Metrics::Type::kCounter,
                   "Shards of other nodes' ranks fetched here to publish a "
                   "step of a job on several nodes.");
  metrics->Declare("ckpt_version_held_bytes", Metrics::Type::kGauge,
                   "Bytes of the published versions this node holds, and of "
                   "those being made or arriving (--publish-budget).");
  return std::unique_ptr<Publisher>(
      new Publisher(fs, std::move(options), std::move(store), coordinator,
                    metrics, std::move(local_file), std::move(fetch_file)));
}

absl::StatusOr<proto::VersionRecord> Publisher::Publish(
    const proto::PublishRequest& request) {
  RETURN_IF_ERROR(ValidateRequest(request));
  const std::string what =
      absl::StrCat("publishing step ", request.step(), " of job ",
                   request.job(), " as topic ", request.topic());
  ASSIGN_OR_RETURN(std::vector<std::string> sources, SourcesOf(request, what));
  absl::MutexLock one_at_a_time(&publish_mu_);
  const absl::Time start = absl::Now();
  VersionMaker making(fs_, store_.get(), options_.node_id, request, what);
  RETURN_IF_ERROR(making.Open(sources));
  ASSIGN_OR_RETURN(proto::VersionRecord record, making.MakeFiles(start));
  ASSIGN_OR_RETURN(proto::VersionRecord numbered,
                   coordinator_->AddVersion(std::move(record)));
  RETURN_IF_ERROR(making.Place(numbered));
  Published(numbered, making.chosen().size(), start, what);
  return numbered;
}

absl::StatusOr<std::vector<std::string>> Publisher::SourcesOf(
    const proto::PublishRequest& request, const std::string& what) {
  ASSIGN_OR_RETURN(absl::optional<proto::CommitRecord> commit,
                   coordinator_->GetCommit(request.job(), request.step(),
                                           proto::TIER_LOCAL_DISK));
  if (!commit.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the step is not committed on disk"));
  }
  std::vector<std::string> sources(commit->world_size());
  std::vector<uint32_t> missing;
  for (uint32_t rank = 0; rank < commit->world_size(); ++rank) {
    ASSIGN_OR_RETURN(absl::optional<std::string> path,
                     local_file_(request.job(), request.step(), rank));
    if (path.has_value()) {
      sources[rank] = *std::move(path);
    } else {
      missing.push_back(rank);
    }
  }
  if (missing.empty()) return sources;
  if (fetch_file_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": rank ", missing.front(), "'s shard is not on this node, and ",
        "this node has no peers to fetch it from (--peer-address): publish ",
        "from a node that holds every rank of the step"));
  }
  RETURN_IF_ERROR(FetchMissing(request, missing, what, sources));
  return sources;
}

absl::Status Publisher::FetchMissing(const proto::PublishRequest& request,
                                     const std::vector<uint32_t>& missing,
                                     const std::string& what,
                                     std::vector<std::string>& sources) {
  const absl::Time start = absl::Now();
  std::vector<absl::Status> fetched(missing.size());
  // A few fetches at a time: the peers serve them in parallel, and a job of
  // many ranks does not start a thread for each.
  std::atomic<size_t> next{0};
  std::vector<std::thread> threads;
  for (size_t t = 0; t < std::min<size_t>(missing.size(), kFetchThreads); ++t) {
    threads.emplace_back([&] {
      for (size_t i = next++; i < missing.size(); i = next++) {
        absl::StatusOr<std::string> path =
            fetch_file_(request.job(), request.step(), missing[i]);
        fetched[i] = path.status();
        if (path.ok()) sources[missing[i]] = *std::move(path);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < missing.size(); ++i) {
    if (!fetched[i].ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": rank ", missing[i], "'s shard is not on this node and ",
          "could not be fetched from a peer: ", fetched[i].ToString()));
    }
  }
  metrics_->Add("ckpt_publish_fetched_shards_total",
                {{"topic", request.topic()}},
                static_cast<double>(missing.size()));
  CKPT_LOG_INFO("{}: fetched the shards of {} ranks from peers in {:.1f} ms",
                what, missing.size(),
                absl::ToDoubleMilliseconds(absl::Now() - start));
  return absl::OkStatus();
}

void Publisher::Published(const proto::VersionRecord& version, size_t items,
                          absl::Time start, const std::string& what) {
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const Labels labels = {{"topic", version.topic()}};
  metrics_->Add("ckpt_published_versions_total", labels);
  metrics_->Add("ckpt_published_bytes_total", labels,
                static_cast<double>(version.bytes()));
  metrics_->Observe("ckpt_publish_seconds", labels, seconds);
  CKPT_LOG_INFO("{}: version {} ({} items, {} bytes{}) in {:.1f} ms", what,
                version.version(), items, version.bytes(),
                version.cast().empty() ? "" : ", cast to " + version.cast(),
                seconds * 1e3);
  HeldBytesChanged();
  absl::MutexLock lock(&mu_);
  ++made_;
  published_.SignalAll();
}

absl::StatusOr<proto::VersionRecord> Publisher::WaitForVersion(
    const std::string& topic, uint64_t after, absl::Time deadline) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  for (;;) {
    // Only a version whose files are here is one a reader here can open.
    const std::set<uint64_t> held = Held(topic);
    if (!held.empty() && *held.rbegin() > after) {
      return HeldRecord(topic, *held.rbegin());
    }
    if (absl::Now() >= deadline) return NoVersionAbove(topic, after, held);
    // Versions made or placed here wake the wait.
    absl::MutexLock lock(&mu_);
    published_.WaitWithDeadline(
        &mu_, std::min(deadline, absl::Now() + absl::Milliseconds(200)));
  }
}

absl::Status Publisher::NoVersionAbove(const std::string& topic, uint64_t after,
                                       const std::set<uint64_t>& held) {
  ASSIGN_OR_RETURN(absl::optional<proto::VersionRecord> newest,
                   coordinator_->NewestVersion(topic));
  std::string why = " (it has none yet)";
  if (newest.has_value()) {
    why = held.empty() ? absl::StrCat(" (its newest is ", newest->version(),
                                      ", and this node holds none of its "
                                      "versions: subscribe to it, ckpt "
                                      "subscribe ",
                                      topic, ")")
                       : absl::StrCat(" (its newest is ", newest->version(),
                                      ", arriving here)");
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "topic ", topic, " has no version above ", after, " on this node", why));
}

absl::StatusOr<proto::OpenVersionResponse> Publisher::OpenVersion(
    const std::string& topic, uint64_t version) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  ASSIGN_OR_RETURN(proto::VersionRecord record, HeldRecord(topic, version));
  // A record is read from a file or the coordinator: its world size is
  // trusted only as far as the files it lists.
  if (record.files_size() != static_cast<int>(record.world_size())) {
    return absl::DataLossError(absl::StrCat(
        "version ", record.version(), " of topic ", topic, " lists ",
        record.files_size(), " files for ", record.world_size(), " ranks"));
  }
  proto::OpenVersionResponse response;
  const std::string dir = store_->VersionDir(topic, record.version());
  for (uint32_t rank = 0; rank < record.world_size(); ++rank) {
    const std::string path =
        io::JoinPath(dir, VersionStore::RankFileName(rank));
    if (!fs_->Exists(path).value_or(false)) {
      return absl::NotFoundError(
          absl::StrCat("version ", record.version(), " of topic ", topic,
                       " is not on this node (any more); it was made on node ",
                       record.source_node()));
    }
    response.add_paths(path);
  }
  *response.mutable_record() = std::move(record);
  return response;
}

absl::StatusOr<proto::VersionRecord> Publisher::HeldRecord(
    const std::string& topic, uint64_t version) {
  const std::set<uint64_t> held = Held(topic);
  if (version == 0 && !held.empty()) version = *held.rbegin();
  if (held.count(version) != 0) {
    absl::StatusOr<proto::VersionRecord> record =
        store_->Record(topic, version);
    if (record.ok()) return record;
  }
  // Not here (or placed before records were kept beside the files): the
  // coordinator's word, for the error or the record.
  ASSIGN_OR_RETURN(std::vector<proto::VersionRecord> versions,
                   coordinator_->ListVersions(topic));
  if (versions.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "topic ", topic, " has no version (ckpt topics lists the topics)"));
  }
  if (version == 0) return versions.back();
  for (proto::VersionRecord& v : versions) {
    if (v.version() == version) return std::move(v);
  }
  return absl::NotFoundError(absl::StrCat("topic ", topic, " has no version ",
                                          version, " (its newest is ",
                                          versions.back().version(), ")"));
}

std::set<uint64_t> Publisher::Held(const std::string& topic) const {
  return store_->Held(topic);
}

absl::StatusOr<proto::ListTopicsResponse> Publisher::ListTopics() {
  ASSIGN_OR_RETURN(std::vector<std::string> topics, coordinator_->ListTopics());
  proto::ListTopicsResponse response;
  for (const std::string& topic : topics) {
    ASSIGN_OR_RETURN(std::vector<proto::VersionRecord> versions,
                     coordinator_->ListVersions(topic));
    ASSIGN_OR_RETURN(std::vector<proto::SubscriberRecord> subscribers,
                     coordinator_->ListSubscribers(topic));
    proto::TopicSummary* summary = response.add_topics();
    summary->set_topic(topic);
    summary->set_versions(static_cast<uint32_t>(versions.size()));
    if (!versions.empty()) {
      summary->set_newest(versions.back().version());
      *summary->mutable_newest_record() = versions.back();
    }
    for (uint64_t v : Held(topic)) summary->add_held(v);
    for (proto::SubscriberRecord& s : subscribers) {
      if (s.node() == options_.node_id) summary->set_subscribed(true);
      *summary->add_subscribers() = std::move(s);
    }
  }
  return response;
}

absl::StatusOr<std::shared_ptr<Arrival>> Publisher::BeginArrival(
    const proto::VersionRecord& record) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(record.topic()));
  const std::string what =
      absl::StrCat("version ", record.version(), " of topic ", record.topic());
  const auto key = std::make_pair(record.topic(), record.version());
  {
    absl::MutexLock lock(&mu_);
    if (arriving_.count(key) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat(what, " is arriving already"));
    }
  }
  // The sizes come from a record another node wrote: they are made room for
  // before any file is made.
  uint64_t bytes = 0;
  for (const proto::VersionFile& file : record.files()) {
    if (file.file_bytes() > options_.budget_bytes - bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          what, ": its files take more than the whole budget for published ",
          "versions (", options_.budget_bytes, " bytes, --publish-budget)"));
    }
    bytes += file.file_bytes();
  }
  if (bytes != record.bytes()) {
    return absl::DataLossError(absl::StrCat(what, ": its record says ",
                                            record.bytes(),
                                            " bytes; its files take ", bytes));
  }
  Arriving arriving;
  ASSIGN_OR_RETURN(arriving.room, store_->MakeRoom(bytes, what));
  ASSIGN_OR_RETURN(
      const std::string dir,
      store_->NewDir(record.topic(),
                     absl::StrCat(kReceivingPrefix, record.version())));
  absl::StatusOr<std::shared_ptr<Arrival>> arrival =
      Arrival::Create(fs_, record, dir);
  if (!arrival.ok()) {
    store_->RemoveDir(dir);
    return arrival.status();
  }
  arriving.arrival = *arrival;
  HeldBytesChanged();
  absl::MutexLock lock(&mu_);
  arriving_[key] = std::move(arriving);
  published_.SignalAll();
  return *std::move(arrival);
}

absl::Status Publisher::PlaceArrival(Arrival& arrival) {
  const proto::VersionRecord& record = arrival.record();
  if (absl::Status placed = store_->Place(arrival.dir(), record);
      !placed.ok()) {
    AbandonArrival(arrival, placed);
    return placed;
  }
  arrival.Finish(absl::OkStatus());
  const Labels labels = {{"topic", record.topic()}};
  metrics_->Add("ckpt_received_versions_total", labels);
  metrics_->Observe(
      "ckpt_version_reach_seconds", labels,
      std::max(0.0, absl::ToDoubleSeconds(
                        absl::Now() -
                        absl::FromUnixMicros(record.created_unix_micros()))));
  {
    absl::MutexLock lock(&mu_);
    arriving_.erase({record.topic(), record.version()});
    ++made_;
    published_.SignalAll();
  }
  HeldBytesChanged();
  return absl::OkStatus();
}

void Publisher::AbandonArrival(Arrival& arrival, const absl::Status& why) {
  arrival.Finish(why);
  store_->RemoveDir(arrival.dir());
  {
    absl::MutexLock lock(&mu_);
    arriving_.erase({arrival.record().topic(), arrival.record().version()});
  }
  HeldBytesChanged();
}

void Publisher::HeldBytesChanged() {
  metrics_->Set("ckpt_version_held_bytes", {},
                static_cast<double>(store_->UsedBytes()));
}

absl::StatusOr<absl::optional<Publisher::PeerRead>> Publisher::PlacedForPeer(
    const proto::VersionFileRequest& request) {
  const std::string path =
      io::JoinPath(store_->VersionDir(request.topic(), request.version()),
                   VersionStore::RankFileName(request.rank()));
  if (!fs_->Exists(path).value_or(false)) return absl::nullopt;
  ASSIGN_OR_RETURN(const uint64_t size, fs_->FileSize(path));
  if (request.offset() > size) {
    return absl::OutOfRangeError(absl::StrCat("offset ", request.offset(),
                                              " is past the end of ", path));
  }
  PeerRead read;
  read.path = path;
  read.offset = request.offset();
  read.bytes = size - request.offset();
  return read;
}

absl::StatusOr<Publisher::PeerRead> Publisher::OpenForPeer(
    const proto::VersionFileRequest& request, absl::Duration wait,
    absl::Duration stall) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(request.topic()));
  const auto key = std::make_pair(request.topic(), request.version());
  const absl::Time deadline = absl::Now() + wait;
  // Once more after the version was found neither arriving nor newer: it may
  // have been placed in between.
  bool last_look = false;
  for (;;) {
    ASSIGN_OR_RETURN(absl::optional<PeerRead> placed, PlacedForPeer(request));
    if (placed.has_value()) return Served(request, *std::move(placed));
    std::shared_ptr<Arrival> arrival;
    {
      absl::MutexLock lock(&mu_);
      auto it = arriving_.find(key);
      if (it != arriving_.end()) arrival = it->second.arrival;
      const std::set<uint64_t> held = Held(request.topic());
      const bool newer = held.empty() || *held.rbegin() < request.version();
      if (arrival == nullptr && !newer && !last_look) {
        last_look = true;
        continue;
      }
      if (arrival == nullptr && (!newer || absl::Now() >= deadline)) {
        return absl::NotFoundError(
            absl::StrCat("this node neither holds nor receives version ",
                         request.version(), " of topic ", request.topic()));
      }
      if (arrival == nullptr) {
        published_.WaitWithDeadline(&mu_, deadline);
        continue;
      }
    }
    PeerRead read;
    read.offset = request.offset();
    ASSIGN_OR_RETURN(
        read.arriving,
        arrival->ReaderFrom(request.rank(), request.offset(), stall));
    ASSIGN_OR_RETURN(read.bytes, read.arriving->Size());
    read.path = arrival->PathOf(request.rank());
    read.wait = arrival->Waiter(request.rank(), stall);
    return Served(request, std::move(read));
  }
}

absl::StatusOr<proto::VersionFileProgress> Publisher::ProgressOf(
    const proto::VersionFileRequest& request) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(request.topic()));
  proto::VersionFileProgress progress;
  ASSIGN_OR_RETURN(absl::optional<PeerRead> placed, PlacedForPeer(request));
  if (placed.has_value()) {
    progress.set_file_bytes(placed->offset + placed->bytes);
    progress.set_arrived(progress.file_bytes());
    return progress;
  }
  absl::MutexLock lock(&mu_);
  auto it = arriving_.find({request.topic(), request.version()});
  if (it == arriving_.end() ||
      request.rank() >= it->second.arrival->record().world_size()) {
    return absl::NotFoundError(
        absl::StrCat("this node neither holds nor receives version ",
                     request.version(), " of topic ", request.topic()));
  }
  progress.set_file_bytes(it->second.arrival->SizeOf(request.rank()));
  progress.set_arrived(it->second.arrival->ArrivedOf(request.rank()));
  return progress;
}

Publisher::PeerRead Publisher::Served(const proto::VersionFileRequest& request,
                                      PeerRead read) {
  metrics_->Add("ckpt_version_bytes_served_total", {{"topic", request.topic()}},
                static_cast<double>(read.bytes));
  return read;
}

}  // namespace ckpt::daemon
