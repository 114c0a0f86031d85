#include "daemon/publish/version_store.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <tuple>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/logging.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

constexpr char kRecordFile[] = "version.pb";

}  // namespace

VersionStore::Room::~Room() { store_->GiveBack(bytes_); }

absl::Status VersionStore::Room::GrowTo(uint64_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  absl::MutexLock lock(&store_->room_mu_);
  RETURN_IF_ERROR(store_->Reserve(bytes - bytes_, what_));
  bytes_ = bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<VersionStore>> VersionStore::Open(
    io::FileSystem* fs, VersionStoreOptions options) {
  if (options.dir.empty()) {
    return absl::InvalidArgumentError("publication: no directory");
  }
  if (options.keep_versions < 1) {
    return absl::InvalidArgumentError(
        "publication: at least one version per topic must be kept");
  }
  if (options.budget_bytes == 0) {
    return absl::InvalidArgumentError(
        "publication: the budget for versions is 0 bytes");
  }
  auto store =
      std::unique_ptr<VersionStore>(new VersionStore(fs, std::move(options)));
  std::vector<std::string> topics;
  if (fs->Exists(store->options_.dir).value_or(false)) {
    ASSIGN_OR_RETURN(topics, fs->ListDir(store->options_.dir));
  }
  for (const std::string& topic : topics) {
    absl::StatusOr<std::vector<std::string>> entries =
        fs->ListDir(store->TopicDir(topic));
    if (!entries.ok()) continue;
    for (const std::string& entry : *entries) {
      if (absl::StartsWith(entry, ".")) {
        store->RemoveDir(io::JoinPath(store->TopicDir(topic), entry));
      }
    }
  }
  return store;
}

std::string VersionStore::RankFileName(uint32_t rank) {
  return absl::StrCat("rank-", rank, ".shard");
}

std::string VersionStore::TopicDir(const std::string& topic) const {
  return io::JoinPath(options_.dir, topic);
}

std::string VersionStore::VersionDir(const std::string& topic,
                                     uint64_t version) const {
  char digits[21];
  std::snprintf(digits, sizeof digits, "%020" PRIu64, version);
  return io::JoinPath(TopicDir(topic), digits);
}

std::set<uint64_t> VersionStore::Held(const std::string& topic) const {
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

absl::StatusOr<proto::VersionRecord> VersionStore::Record(
    const std::string& topic, uint64_t version) const {
  const std::string path =
      io::JoinPath(VersionDir(topic, version), kRecordFile);
  ASSIGN_OR_RETURN(std::string bytes, io::ReadFileToString(fs_, path));
  proto::VersionRecord record;
  if (!record.ParseFromString(bytes) || record.version() != version ||
      record.topic() != topic) {
    return absl::DataLossError(absl::StrCat(
        path, " is not the record of version ", version, " of topic ", topic));
  }
  return record;
}

absl::StatusOr<std::string> VersionStore::NewDir(const std::string& topic,
                                                 const std::string& name) {
  if (!absl::StartsWith(name, ".")) {
    return absl::InternalError(
        absl::StrCat("a version's directory in the making, ", name,
                     ", must start with '.'"));
  }
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(options_.dir));
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(TopicDir(topic)));
  const std::string dir = io::JoinPath(TopicDir(topic), name);
  if (fs_->Exists(dir).value_or(false)) RemoveDir(dir);
  RETURN_IF_ERROR(fs_->CreatePrivateDirs(dir));
  return dir;
}

absl::Status VersionStore::Place(const std::string& dir,
                                 const proto::VersionRecord& record) {
  RETURN_IF_ERROR(io::WriteStringToFile(fs_, io::JoinPath(dir, kRecordFile),
                                        record.SerializeAsString()));
  const std::string version_dir = VersionDir(record.topic(), record.version());
  if (fs_->Exists(version_dir).value_or(false)) RemoveDir(version_dir);
  RETURN_IF_ERROR(fs_->Rename(dir, version_dir));
  CollectGarbage(record.topic());
  return absl::OkStatus();
}

void VersionStore::RemoveDir(const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(dir);
  if (names.ok()) {
    for (const std::string& name : *names) {
      (void)fs_->Unlink(io::JoinPath(dir, name));
    }
  }
  if (absl::Status s = fs_->RemoveDir(dir); !s.ok()) {
    CKPT_LOG_WARN("publication: removing {}: {}", dir, s.ToString());
  }
}

bool VersionStore::InUse(const std::string& topic, uint64_t version) const {
  const std::string dir = VersionDir(topic, version);
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(dir);
  if (!names.ok()) return false;
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, ".shard")) continue;
    // A probe that fails keeps the version: better held than torn.
    if (fs_->InUse(io::JoinPath(dir, name)).value_or(true)) return true;
  }
  return false;
}

void VersionStore::CollectGarbage(const std::string& topic) {
  std::set<uint64_t> held = Held(topic);
  int keep = options_.keep_versions;
  for (auto it = held.rbegin(); it != held.rend(); ++it) {
    if (keep > 0) {
      --keep;
    } else if (!InUse(topic, *it)) {
      RemoveDir(VersionDir(topic, *it));
    }
  }
}

uint64_t VersionStore::BytesIn(const std::string& dir) const {
  uint64_t bytes = 0;
  absl::StatusOr<std::vector<std::string>> names = fs_->ListDir(dir);
  if (!names.ok()) return 0;
  for (const std::string& name : *names) {
    bytes += fs_->FileSize(io::JoinPath(dir, name)).value_or(0);
  }
  return bytes;
}

std::vector<VersionStore::Placed> VersionStore::Versions() const {
  std::vector<Placed> out;
  absl::StatusOr<std::vector<std::string>> topics = fs_->ListDir(options_.dir);
  if (!topics.ok()) return out;
  for (const std::string& topic : *topics) {
    const std::set<uint64_t> held = Held(topic);
    for (uint64_t version : held) {
      Placed p;
      p.topic = topic;
      p.version = version;
      p.bytes = BytesIn(VersionDir(topic, version));
      absl::StatusOr<proto::VersionRecord> record = Record(topic, version);
      if (record.ok()) p.created_unix_micros = record->created_unix_micros();
      p.newest = version == *held.rbegin();
      p.in_use = InUse(topic, version);
      out.push_back(std::move(p));
    }
  }
  return out;
}

uint64_t VersionStore::UsedBytes() const {
  uint64_t used = 0;
  for (const Placed& p : Versions()) used += p.bytes;
  absl::MutexLock lock(&mu_);
  return used + reserved_;
}

absl::StatusOr<std::unique_ptr<VersionStore::Room>> VersionStore::MakeRoom(
    uint64_t bytes, const std::string& what) {
  absl::MutexLock lock(&room_mu_);
  RETURN_IF_ERROR(Reserve(bytes, what));
  return std::unique_ptr<Room>(new Room(this, bytes, what));
}

absl::Status VersionStore::Reserve(uint64_t more, const std::string& what) {
  const uint64_t budget = options_.budget_bytes;
  if (more > budget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", more, " bytes, more than the whole budget for ",
        "published versions (", budget, " bytes, --publish-budget)"));
  }
  for (;;) {
    std::vector<Placed> versions = Versions();
    uint64_t used = 0;
    for (const Placed& p : versions) used += p.bytes;
    {
      absl::MutexLock lock(&mu_);
      used += reserved_;
      if (used <= budget && more <= budget - used) {
        reserved_ += more;
        return absl::OkStatus();
      }
    }
    // The oldest version no reader holds that is not its topic's newest.
    const Placed* victim = nullptr;
    std::vector<std::string> holding;
    for (const Placed& p : versions) {
      holding.push_back(absl::StrCat(p.topic, " version ", p.version, " (",
                                     p.bytes, " bytes",
                                     p.in_use ? ", held by a reader" : "",
                                     p.newest ? ", its newest" : "", ")"));
      if (p.newest || p.in_use) continue;
      if (victim == nullptr ||
          std::tie(p.created_unix_micros, p.version) <
              std::tie(victim->created_unix_micros, victim->version)) {
        victim = &p;
      }
    }
    if (victim == nullptr) {
      absl::MutexLock lock(&mu_);
      return absl::ResourceExhaustedError(absl::StrCat(
          what, " needs ", more, " bytes; the budget for published versions (",
          budget, " bytes, --publish-budget) holds ", used, ": topic ",
          holding.empty() ? "none" : absl::StrJoin(holding, ", topic "),
          "; and ", reserved_, " bytes of versions being made or arriving"));
    }
    CKPT_LOG_INFO(
        "publication: version {} of topic {} goes to make room for {}",
        victim->version, victim->topic, what);
    RemoveDir(VersionDir(victim->topic, victim->version));
  }
}

void VersionStore::GiveBack(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  reserved_ -= std::min(reserved_, bytes);
}

}  // namespace ckpt::daemon
