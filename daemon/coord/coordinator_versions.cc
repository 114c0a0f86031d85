// Coordinator's published versions (publish/): each topic's versions, its
// newest, and its subscribers, in the same key space as the commits
// (coord/coordinator.h).
#include <cinttypes>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "daemon/coord/coordinator.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/names.h"

namespace ckpt::daemon {

namespace {

constexpr char kTopicsPrefix[] = "/ckpt/@topics/";

std::string VersionsPrefix(const std::string& topic) {
  return absl::StrCat(kTopicsPrefix, topic, "/versions/");
}

std::string NewestKey(const std::string& topic) {
  return absl::StrCat(kTopicsPrefix, topic, "/newest");
}

std::string SubscribersPrefix(const std::string& topic) {
  return absl::StrCat(kTopicsPrefix, topic, "/subscribers/");
}

}  // namespace

// Zero-padded, so versions list in order.
std::string Coordinator::VersionKey(const std::string& topic,
                                    uint64_t version) {
  char digits[21];
  std::snprintf(digits, sizeof digits, "%020" PRIu64, version);
  return VersionsPrefix(topic) + digits;
}

absl::Status Coordinator::WaitForVersionAfter(const std::string& topic,
                                              uint64_t after,
                                              absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    ASSIGN_OR_RETURN(absl::optional<proto::VersionRecord> newest,
                     NewestVersion(topic));
    if (newest.has_value() && newest->version() > after) {
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) return absl::OkStatus();
    absl::SleepFor(std::min(absl::Milliseconds(50), deadline - absl::Now()));
  }
}

absl::StatusOr<proto::VersionRecord> Coordinator::AddVersion(
    proto::VersionRecord record) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(record.topic()));
  ASSIGN_OR_RETURN(std::vector<proto::VersionRecord> kept,
                   ListVersions(record.topic()));
  uint64_t version = kept.empty() ? 1 : kept.back().version() + 1;
  for (int attempt = 0; attempt < 100; ++attempt, ++version) {
    record.set_version(version);
    ASSIGN_OR_RETURN(bool created,
                     StoreCreate(VersionKey(record.topic(), version),
                                 record.SerializeAsString()));
    if (created) {
      RETURN_IF_ERROR(RecordNewest(record));
      ForgetOldVersions(record.topic(), kept, version);
      return record;
    }
  }
  return absl::AbortedError(absl::StrCat("topic ", record.topic(),
                                         ": no free version after 100 tries"));
}

void Coordinator::ForgetOldVersions(
    const std::string& topic, const std::vector<proto::VersionRecord>& kept,
    uint64_t newest) {
  for (const proto::VersionRecord& old : kept) {
    if (old.version() + kVersionRecordsKept > newest) break;  // oldest first
    // Left for the next publish when it fails (fenced, say).
    if (absl::Status s = StoreDelete(VersionKey(topic, old.version()));
        !s.ok()) {
      CKPT_LOG_WARN("topic {}: removing the record of version {}: {}", topic,
                    old.version(), s.ToString());
      return;
    }
  }
}

absl::Status Coordinator::RecordNewest(const proto::VersionRecord& record) {
  // Racing publishers may leave an older one here: NewestVersion looks past.
  return StorePut(NewestKey(record.topic()), record.SerializeAsString(),
                  /*ephemeral=*/false);
}

absl::StatusOr<absl::optional<proto::VersionRecord>> Coordinator::NewestVersion(
    const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  ASSIGN_OR_RETURN(absl::optional<std::string> value,
                   StoreGet(NewestKey(topic)));
  absl::optional<proto::VersionRecord> newest;
  if (value.has_value()) {
    ASSIGN_OR_RETURN(
        newest, ParseRecord<proto::VersionRecord>(NewestKey(topic), *value));
  } else {
    // No record of the newest (none published yet): the list says.
    ASSIGN_OR_RETURN(std::vector<proto::VersionRecord> versions,
                     ListVersions(topic));
    if (versions.empty()) return absl::nullopt;
    newest = versions.back();
  }
  // The versions after it (numbered in order) that a racing publisher's
  // record left out.
  for (;;) {
    const std::string key =
        VersionKey(topic, newest ? newest->version() + 1 : 1);
    ASSIGN_OR_RETURN(absl::optional<std::string> next, StoreGet(key));
    if (!next.has_value()) return newest;
    ASSIGN_OR_RETURN(newest, ParseRecord<proto::VersionRecord>(key, *next));
  }
}

absl::StatusOr<std::vector<proto::VersionRecord>> Coordinator::ListVersions(
    const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  ASSIGN_OR_RETURN(auto entries, StoreScan(VersionsPrefix(topic)));
  std::vector<proto::VersionRecord> versions;
  for (const auto& [key, value] : entries) {
    ASSIGN_OR_RETURN(
        proto::VersionRecord v,
        ParseRecord<proto::VersionRecord>(VersionsPrefix(topic) + key, value));
    versions.push_back(std::move(v));
  }
  return versions;
}

absl::Status Coordinator::PutSubscriber(const proto::SubscriberRecord& record) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(record.topic()));
  RETURN_IF_ERROR(snapshot::ValidateJobId(record.node()));
  return StorePut(SubscribersPrefix(record.topic()) + record.node(),
                  record.SerializeAsString(), /*ephemeral=*/true);
}

absl::StatusOr<std::vector<proto::SubscriberRecord>>
Coordinator::ListSubscribers(const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  ASSIGN_OR_RETURN(auto entries, StoreScan(SubscribersPrefix(topic)));
  std::vector<proto::SubscriberRecord> subscribers;
  for (const auto& [key, value] : entries) {
    ASSIGN_OR_RETURN(proto::SubscriberRecord record,
                     ParseRecord<proto::SubscriberRecord>(
                         SubscribersPrefix(topic) + key, value));
    subscribers.push_back(std::move(record));
  }
  return subscribers;
}

absl::StatusOr<std::vector<std::string>> Coordinator::ListTopics() {
  ASSIGN_OR_RETURN(std::vector<std::string> keys, StoreKeys(kTopicsPrefix));
  std::vector<std::string> topics;
  for (const std::string& key : keys) {
    const std::string topic = key.substr(0, key.find('/'));
    if (topics.empty() || topics.back() != topic) topics.push_back(topic);
  }
  return topics;
}

}  // namespace ckpt::daemon
