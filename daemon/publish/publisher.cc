#include "daemon/publish/publisher.h"

#include <fnmatch.h>

#include <cinttypes>
#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/aligned_buffer.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/cast.h"
#include "snapshot/dtype.h"
#include "snapshot/names.h"
#include "snapshot/shard_reader.h"
#include "snapshot/shard_writer.h"

namespace ckpt::daemon {
namespace {

constexpr char kMakingPrefix[] = ".making-";
constexpr char kReceivingPrefix[] = ".receiving-";
// A placed version's record, beside its files: opening one asks nobody.
constexpr char kRecordFile[] = "version.pb";

std::string RankFileName(uint32_t rank) {
  return absl::StrCat("rank-", rank, ".shard");
}

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

// Removes a directory of files (a version's, or one cut short).
void RemoveFilesAndDir(io::FileSystem* fs, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(dir);
  if (names.ok()) {
    for (const std::string& name : *names) {
      (void)fs->Unlink(io::JoinPath(dir, name));
    }
  }
  if (absl::Status s = fs->RemoveDir(dir); !s.ok()) {
    CKPT_LOG_WARN("publication: removing {}: {}", dir, s.ToString());
  }
}

}  // namespace

// One version's files, made rank by rank in a directory of their own.
class Publisher::Making {
 public:
  Making(Publisher& publisher, const proto::PublishRequest& request,
         uint32_t world_size, std::string dir)
      : publisher_(publisher),
        request_(request),
        world_size_(world_size),
        dir_(std::move(dir)) {}

  // Rank `rank`'s file from its shard at `source`: the chosen items, cast.
  absl::StatusOr<proto::VersionFile> MakeRankFile(uint32_t rank,
                                                  const std::string& source) {
    io::FileSystem* fs = publisher_.fs_;
    ASSIGN_OR_RETURN(std::unique_ptr<snapshot::ShardReader> reader,
                     snapshot::ShardReader::Open(fs, source));
    const std::string path = io::JoinPath(dir_, RankFileName(rank));
    snapshot::ShardWriterOptions options;
    options.codec.codec = proto::CODEC_NONE;  // readers copy straight out
    options.direct_io = false;                // tmpfs
    snapshot::ShardWriter writer(
        fs, path, {request_.job(), request_.step(), rank, world_size_},
        options);
    // Every chosen item's bytes, kept until the writer committed them, page
    // aligned: its chunks are stored in place, so readers map them
    // (client/subscriber.h's views).
    std::vector<io::AlignedBuffer> kept;
    for (const proto::Item& item : reader->manifest().items()) {
      if (!Chosen(item.name())) continue;
      chosen_.insert(item.name());
      kept.emplace_back(item.raw_size());
      RETURN_IF_ERROR(reader->ReadItem(item.name(), kept.back().span()));
      RETURN_IF_ERROR(Add(writer, item, kept));
    }
    RETURN_IF_ERROR(writer.Commit().status());
    ASSIGN_OR_RETURN(const uint64_t bytes, fs->FileSize(path));
    proto::VersionFile file;
    file.set_rank(rank);
    file.set_file_bytes(bytes);
    file.set_manifest_xxh3(writer.manifest_xxh3());
    file.set_node(publisher_.options_.node_id);
    return file;
  }

  // The names chosen in any rank so far.
  const std::set<std::string>& chosen() const { return chosen_; }

  // Removes the files unless they were placed.
  ~Making() {
    if (!placed_) RemoveFilesAndDir(publisher_.fs_, dir_);
  }

  // Every rank's file, from its shard at `sources[rank]`; the version's
  // record, not yet numbered. InvalidArgument when no item was chosen.
  absl::StatusOr<proto::VersionRecord> MakeFiles(
      const std::vector<std::string>& sources, const std::string& what) {
    RETURN_IF_ERROR(publisher_.fs_->CreatePrivateDirs(dir_));
    proto::VersionRecord record;
    for (uint32_t rank = 0; rank < sources.size(); ++rank) {
      absl::StatusOr<proto::VersionFile> file =
          MakeRankFile(rank, sources[rank]);
      if (!file.ok()) {
        return absl::Status(
            file.status().code(),
            absl::StrCat(what, ": rank ", rank, ": ", file.status().message()));
      }
      record.set_bytes(record.bytes() + file->file_bytes());
      *record.add_files() = *std::move(file);
    }
    if (chosen_.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": no item matches --items ",
                       absl::StrJoin(request_.items(), " ")));
    }
    record.set_topic(request_.topic());
    record.set_job(request_.job());
    record.set_step(request_.step());
    record.set_world_size(world_size_);
    *record.mutable_items() = request_.items();
    record.set_cast(request_.cast());
    record.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
    record.set_source_node(publisher_.options_.node_id);
    return record;
  }

  // Renames the files' directory to `version_dir`. A directory of the same
  // version left by an earlier life of this node (its coordinator's records
  // gone since) is not this version: it goes first.
  absl::Status PlaceAs(const std::string& version_dir,
                       const proto::VersionRecord& record) {
    io::FileSystem* fs = publisher_.fs_;
    RETURN_IF_ERROR(io::WriteStringToFile(fs, io::JoinPath(dir_, kRecordFile),
                                          record.SerializeAsString()));
    if (fs->Exists(version_dir).value_or(false)) {
      RemoveFilesAndDir(fs, version_dir);
    }
    RETURN_IF_ERROR(fs->Rename(dir_, version_dir));
    placed_ = true;
    return absl::OkStatus();
  }

 private:
  bool Chosen(const std::string& name) const {
    if (request_.items().empty()) return true;
    for (const std::string& glob : request_.items()) {
      if (::fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
    }
    return false;
  }

  // The item as read into kept.back(), cast when asked.
  absl::Status Add(snapshot::ShardWriter& writer, const proto::Item& item,
                   std::vector<io::AlignedBuffer>& kept) {
    if (item.kind() != proto::ITEM_KIND_TENSOR) {
      return writer.AddBytes(item.name(), kept.back().span());
    }
    snapshot::TensorRef tensor;
    tensor.name = item.name();
    tensor.dtype = item.dtype();
    tensor.global_shape.assign(item.global_shape().begin(),
                               item.global_shape().end());
    tensor.box_offset.assign(item.box_offset().begin(),
                             item.box_offset().end());
    tensor.box_length.assign(item.box_length().begin(),
                             item.box_length().end());
    if (request_.cast() == "bf16" && item.dtype() == proto::DTYPE_FLOAT32) {
      io::AlignedBuffer cast(kept.back().size() / 2);
      RETURN_IF_ERROR(
          snapshot::CastFloat32ToBfloat16(kept.back().span(), cast.span()));
      kept.back() = std::move(cast);
      tensor.dtype = proto::DTYPE_BFLOAT16;
    }
    tensor.data = kept.back().span();
    return writer.AddTensor(tensor);
  }

  Publisher& publisher_;
  const proto::PublishRequest& request_;
  const uint32_t world_size_;
  const std::string dir_;
  std::set<std::string> chosen_;
  bool placed_ = false;
};

Publisher::Publisher(io::FileSystem* fs, PublishOptions options,
                     Coordinator* coordinator, Metrics* metrics,
                     LocalShardFile local_file)
    : fs_(fs),
      options_(std::move(options)),
      coordinator_(coordinator),
      metrics_(metrics),
      local_file_(std::move(local_file)) {}

absl::StatusOr<std::unique_ptr<Publisher>> Publisher::Open(
    io::FileSystem* fs, PublishOptions options, Coordinator* coordinator,
    Metrics* metrics, LocalShardFile local_file) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("publication: no directory");
  }
  if (options.keep_versions < 1) {
    return absl::InvalidArgumentError(
        "publication: at least one version per topic must be kept");
  }
  // Made at the first publish: a ckptd that never publishes leaves nothing.
  std::vector<std::string> topics;
  if (fs->Exists(options.dir).value_or(false)) {
    ASSIGN_OR_RETURN(topics, fs->ListDir(options.dir));
  }
  for (const std::string& topic : topics) {
    const std::string topic_dir = io::JoinPath(options.dir, topic);
    absl::StatusOr<std::vector<std::string>> entries = fs->ListDir(topic_dir);
    if (!entries.ok()) continue;
    for (const std::string& entry : *entries) {
      if (absl::StartsWith(entry, kMakingPrefix) ||
          absl::StartsWith(entry, kReceivingPrefix)) {
        RemoveFilesAndDir(fs, io::JoinPath(topic_dir, entry));
      }
    }
  }
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
  return std::unique_ptr<Publisher>(new Publisher(
      fs, std::move(options), coordinator, metrics, std::move(local_file)));
}

std::string Publisher::TopicDir(const std::string& topic) const {
  return io::JoinPath(options_.dir, topic);
}

std::string Publisher::VersionDir(const std::string& topic,
                                  uint64_t version) const {
  char digits[21];
  std::snprintf(digits, sizeof digits, "%020" PRIu64, version);
  return io::JoinPath(TopicDir(topic), digits);
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
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(options_.dir));
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(TopicDir(request.topic())));
  Making making(
      *this, request, static_cast<uint32_t>(sources.size()),
      io::JoinPath(TopicDir(request.topic()),
                   absl::StrCat(kMakingPrefix, absl::ToUnixMicros(start))));
  ASSIGN_OR_RETURN(proto::VersionRecord record,
                   making.MakeFiles(sources, what));
  ASSIGN_OR_RETURN(proto::VersionRecord numbered,
                   coordinator_->AddVersion(std::move(record)));
  RETURN_IF_ERROR(making.PlaceAs(
      VersionDir(request.topic(), numbered.version()), numbered));
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
  std::vector<std::string> sources;
  for (uint32_t rank = 0; rank < commit->world_size(); ++rank) {
    ASSIGN_OR_RETURN(absl::optional<std::string> path,
                     local_file_(request.job(), request.step(), rank));
    if (!path.has_value()) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": rank ", rank, "'s shard is not on this node (publish from ",
          "a node that holds every rank of the step)"));
    }
    sources.push_back(*path);
  }
  return sources;
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
  CollectGarbage(version.topic());
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
  const std::string dir = VersionDir(topic, record.version());
  for (uint32_t rank = 0; rank < record.world_size(); ++rank) {
    const std::string path = io::JoinPath(dir, RankFileName(rank));
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
    absl::StatusOr<std::string> bytes = io::ReadFileToString(
        fs_, io::JoinPath(VersionDir(topic, version), kRecordFile));
    proto::VersionRecord record;
    if (bytes.ok() && record.ParseFromString(*bytes) &&
        record.version() == version && record.topic() == topic) {
      return record;
    }
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
  std::set<uint64_t> held;
  absl::StatusOr<std::vector<std::string>> entries =
      fs_->ListDir(TopicDir(topic));
  if (!entries.ok()) return held;
  for (const std::string& entry : *entries) {
    uint64_t version = 0;
    if (absl::SimpleAtoi(entry, &version)) held.insert(version);
  }
  return held;
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
  const auto key = std::make_pair(record.topic(), record.version());
  {
    absl::MutexLock lock(&mu_);
    if (arriving_.count(key) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("version ", record.version(),
                                                   " of topic ", record.topic(),
                                                   " is arriving already"));
    }
  }
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(options_.dir));
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(TopicDir(record.topic())));
  const std::string dir =
      io::JoinPath(TopicDir(record.topic()),
                   absl::StrCat(kReceivingPrefix, record.version()));
  if (fs_->Exists(dir).value_or(false)) RemoveFilesAndDir(fs_, dir);
  ASSIGN_OR_RETURN(std::shared_ptr<Arrival> arrival,
                   Arrival::Create(fs_, record, dir));
  absl::MutexLock lock(&mu_);
  arriving_[key] = arrival;
  published_.SignalAll();
  return arrival;
}

absl::Status Publisher::PlaceArrival(Arrival& arrival) {
  const proto::VersionRecord& record = arrival.record();
  const std::string version_dir = VersionDir(record.topic(), record.version());
  if (fs_->Exists(version_dir).value_or(false)) {
    RemoveFilesAndDir(fs_, version_dir);
  }
  absl::Status placed =
      io::WriteStringToFile(fs_, io::JoinPath(arrival.dir(), kRecordFile),
                            record.SerializeAsString());
  if (placed.ok()) placed = fs_->Rename(arrival.dir(), version_dir);
  if (!placed.ok()) {
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
  CollectGarbage(record.topic());
  absl::MutexLock lock(&mu_);
  arriving_.erase({record.topic(), record.version()});
  ++made_;
  published_.SignalAll();
  return absl::OkStatus();
}

void Publisher::AbandonArrival(Arrival& arrival, const absl::Status& why) {
  arrival.Finish(why);
  RemoveFilesAndDir(fs_, arrival.dir());
  absl::MutexLock lock(&mu_);
  arriving_.erase({arrival.record().topic(), arrival.record().version()});
}

absl::StatusOr<absl::optional<Publisher::PeerRead>> Publisher::PlacedForPeer(
    const proto::VersionFileRequest& request) {
  const std::string path =
      io::JoinPath(VersionDir(request.topic(), request.version()),
                   RankFileName(request.rank()));
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
      if (it != arriving_.end()) arrival = it->second;
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

Publisher::PeerRead Publisher::Served(const proto::VersionFileRequest& request,
                                      PeerRead read) {
  metrics_->Add("ckpt_version_bytes_served_total", {{"topic", request.topic()}},
                static_cast<double>(read.bytes));
  return read;
}

void Publisher::CollectGarbage(const std::string& topic) {
  std::set<uint64_t> held = Held(topic);
  while (held.size() > static_cast<size_t>(options_.keep_versions)) {
    RemoveFilesAndDir(fs_, VersionDir(topic, *held.begin()));
    held.erase(held.begin());
  }
}

}  // namespace ckpt::daemon
