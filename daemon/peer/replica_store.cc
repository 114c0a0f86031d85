#include "daemon/peer/replica_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "daemon/common/describe.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/chunk_codec.h"
#include "snapshot/format.h"
#include "snapshot/names.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_check.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {
namespace {

uint64_t ManifestXxh3(const snapshot::ShardReader& reader) {
  const std::string& m = reader.manifest_bytes();
  return snapshot::Checksum(
      {reinterpret_cast<const uint8_t*>(m.data()), m.size()});
}

constexpr absl::string_view kSuffix = ".ckpt";
constexpr absl::string_view kPartial = ".partial";

// "<step:020>-<rank:010>.ckpt"
bool ParseName(absl::string_view name, uint64_t* step, uint32_t* rank) {
  if (!absl::ConsumeSuffix(&name, kSuffix)) return false;
  std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
  return parts.size() == 2 && parts[0].size() == 20 && parts[1].size() == 10 &&
         absl::SimpleAtoi(parts[0], step) && absl::SimpleAtoi(parts[1], rank);
}

}  // namespace

absl::StatusOr<std::unique_ptr<ReplicaStore>> ReplicaStore::Open(
    io::FileSystem* fs, std::string dir, uint64_t budget_bytes) {
  if (dir.empty()) return absl::InvalidArgumentError("replica dir is empty");
  RETURN_IF_ERROR(fs->CreatePrivateDirs(dir));
  std::unique_ptr<ReplicaStore> store(
      new ReplicaStore(fs, std::move(dir), budget_bytes));
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs->ListDir(store->dir_));
  absl::MutexLock lock(&store->mu_);
  std::map<Key, proto::ShardManifest> adopted;
  for (const std::string& job : jobs) {
    const std::string job_dir = io::JoinPath(store->dir_, job);
    absl::StatusOr<std::vector<std::string>> names = fs->ListDir(job_dir);
    if (!names.ok() || !snapshot::ValidateJobId(job).ok()) {
      CKPT_LOG_WARN("replicas: ignoring unexpected entry {}", job_dir);
      continue;
    }
    for (const std::string& name : *names) {
      const std::string path = io::JoinPath(job_dir, name);
      Entry e;
      e.key.job = job;
      e.path = path;
      absl::StatusOr<uint64_t> size = fs->FileSize(path);
      if (!ParseName(name, &e.key.step, &e.key.rank) || !size.ok()) {
        // A transfer a crash cut short, or something that is not ours.
        CKPT_LOG_INFO("replicas: removing {} (not a complete replica)", path);
        (void)fs->Unlink(path);
        continue;
      }
      e.bytes = *size;
      snapshot::ShardReaderOptions options;
      options.direct_io = false;
      absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
          snapshot::ShardReader::Open(fs, path, options);
      if (!reader.ok()) {
        CKPT_LOG_INFO("replicas: removing {}: {}", path,
                      reader.status().ToString());
        (void)fs->Unlink(path);
        continue;
      }
      e.manifest_xxh3 = ManifestXxh3(**reader);
      for (const proto::BaseShard& b : (*reader)->manifest().bases())
        e.base_steps.push_back(b.step());
      adopted[e.key] = (*reader)->manifest();
      store->used_ += e.bytes;
      store->files_[e.key] = e;
    }
  }
  // Increments whose bases did not survive are never readable: gone too.
  // (Bases are earlier steps: in step order, a base is judged first.)
  for (const auto& [key, manifest] : adopted) {
    absl::Status bases = store->HasBases(key, manifest);
    if (bases.ok()) continue;
    CKPT_LOG_INFO("replicas: removing {}: {}", store->files_[key].path,
                  bases.ToString());
    (void)fs->Unlink(store->files_[key].path);
    store->used_ -= store->files_[key].bytes;
    store->files_.erase(key);
  }
  return store;
}

absl::Status ReplicaStore::HasBases(const Key& key,
                                    const proto::ShardManifest& m) const {
  for (const proto::BaseShard& b : m.bases()) {
    auto it = files_.find(Key{key.job, b.step(), key.rank});
    if (it == files_.end() || it->second.manifest_xxh3 != b.manifest_xxh3()) {
      return absl::FailedPreconditionError(absl::StrCat(
          Describe(key), " stores chunks in step ", b.step(), ", of which ",
          it == files_.end() ? "this node holds no copy"
                             : "this node holds another copy"));
    }
  }
  return absl::OkStatus();
}

bool ReplicaStore::IsBase(const Key& key) const {
  for (auto it = files_.upper_bound(key);
       it != files_.end() && it->first.job == key.job; ++it) {
    if (it->first.rank != key.rank) continue;
    const std::vector<uint64_t>& bases = it->second.base_steps;
    if (std::find(bases.begin(), bases.end(), key.step) != bases.end())
      return true;
  }
  return false;
}

absl::Status ReplicaStore::DetachDependents(const Key& key) {
  // Rewriting a file changes it, so the increments built on those go too:
  // every later file of the rank that names `key` or one of those as a base
  // (bases are earlier steps: one pass in step order finds them).
  std::set<uint64_t> moving = {key.step};
  std::vector<Entry*> dependents;
  for (auto it = files_.upper_bound(key);
       it != files_.end() && it->first.job == key.job; ++it) {
    Entry& e = it->second;
    if (e.key.rank != key.rank ||
        std::none_of(e.base_steps.begin(), e.base_steps.end(),
                     [&](uint64_t s) { return moving.count(s) > 0; })) {
      continue;
    }
    moving.insert(e.key.step);
    dependents.push_back(&e);
  }
  // Newest first: each is read through its bases as they still are.
  for (auto it = dependents.rbegin(); it != dependents.rend(); ++it) {
    Entry& e = **it;
    absl::StatusOr<snapshot::Detached> file =
        snapshot::MakeSelfContained(fs_, e.path);
    if (!file.ok()) {
      return absl::Status(
          file.status().code(),
          absl::StrCat(Describe(key), ": another copy of it arrived, and ",
                       Describe(e.key),
                       ", held here, which stores chunks in it, could not be "
                       "made self-contained: ",
                       file.status().message()));
    }
    used_ = used_ - std::min(used_, e.bytes) + file->size;
    e.bytes = file->size;
    e.manifest_xxh3 = file->manifest_xxh3;
    e.base_steps.clear();
    CKPT_LOG_INFO(
        "replicas: {} made self-contained: step {}, which it stored chunks "
        "in, arrived as another save",
        Describe(e.key), key.step);
  }
  return absl::OkStatus();
}

std::string ReplicaStore::PathOf(const Key& key) const {
  char name[64];
  std::snprintf(name, sizeof(name), "%020" PRIu64 "-%010" PRIu32 ".ckpt",
                key.step, key.rank);
  return io::JoinPath(io::JoinPath(dir_, key.job), name);
}

absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> ReplicaStore::Receive(
    const Key& key, uint64_t bytes, bool mapped) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(key.job));
  if (bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(key), ": an empty shard file"));
  }
  {
    absl::MutexLock lock(&mu_);
    if (used_ + bytes > budget_) {
      return absl::ResourceExhaustedError(
          absl::StrCat("replicas in ", dir_, ": ", Describe(key), " needs ",
                       bytes, " bytes, ", budget_ - std::min(used_, budget_),
                       " of ", budget_, " are free"));
    }
    used_ += bytes;
  }
  std::unique_ptr<Receiver> r(new Receiver(this, key, bytes));
  const std::string path = PathOf(key);
  r->partial_ = absl::StrCat(path, kPartial);
  absl::Status s = fs_->CreateDirs(io::DirName(path));
  if (s.ok()) (void)fs_->Unlink(r->partial_);  // a leftover of a failed push
  if (s.ok() && mapped) {
    absl::StatusOr<std::unique_ptr<io::MappedFile>> map =
        fs_->MapFile(r->partial_, {.create_size = bytes, .populate = true});
    s = map.status();
    if (map.ok()) r->map_ = *std::move(map);
  } else if (s.ok()) {
    absl::StatusOr<std::unique_ptr<io::WritableFile>> file =
        fs_->NewWritableFile(r->partial_, {});
    s = file.status();
    if (file.ok()) s = (*file)->Truncate(bytes);
    absl::MutexLock lock(&r->write_mu_);
    if (file.ok()) r->file_ = *std::move(file);
  }
  if (!s.ok()) {
    r->partial_.clear();  // nothing of ours to delete
    return absl::Status(s.code(),
                        absl::StrCat(Describe(key), ": ", s.message()));
  }
  return r;
}

ReplicaStore::Receiver::Receiver(ReplicaStore* store, Key key, uint64_t bytes)
    : store_(store), key_(std::move(key)), bytes_(bytes) {}

ReplicaStore::Receiver::~Receiver() {
  if (done_) return;
  map_.reset();
  {
    absl::MutexLock lock(&write_mu_);
    file_.reset();
  }
  if (!partial_.empty()) (void)store_->fs_->Unlink(partial_);
  store_->Release(bytes_);
}

absl::Status ReplicaStore::Receiver::Append(absl::string_view data) {
  if (done_ || map_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key_), ": the transfer is over"));
  }
  if (data.size() > bytes_ - received_) {
    return absl::InvalidArgumentError(absl::StrCat(Describe(key_),
                                                   ": more than the announced ",
                                                   bytes_, " bytes arrived"));
  }
  std::memcpy(map_->data() + received_, data.data(), data.size());
  received_ += data.size();
  return absl::OkStatus();
}

absl::Span<uint8_t> ReplicaStore::Receiver::Unfilled() {
  if (done_ || map_ == nullptr) return {};
  return absl::MakeSpan(map_->data() + received_, bytes_ - received_);
}

absl::Status ReplicaStore::Receiver::Filled(size_t n) {
  if (done_ || map_ == nullptr || n > bytes_ - received_) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(key_), ": ", n, " bytes filled beyond the transfer"));
  }
  received_ += n;
  return absl::OkStatus();
}

absl::Status ReplicaStore::Receiver::WriteAt(uint64_t offset,
                                             absl::Span<const uint8_t> bytes) {
  absl::MutexLock lock(&write_mu_);
  if (done_ || file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(Describe(key_), ": not a transfer written at offsets"));
  }
  if (offset > bytes_ || bytes.size() > bytes_ - offset) {
    return absl::InvalidArgumentError(absl::StrCat(
        Describe(key_), ": bytes at ", offset, " to ", offset + bytes.size(),
        " are past the announced ", bytes_));
  }
  RETURN_IF_ERROR(file_->WriteBorrowed(offset, bytes));
  RETURN_IF_ERROR(file_->Flush());
  received_ += bytes.size();
  return absl::OkStatus();
}

absl::StatusOr<ReplicaStore::Entry> ReplicaStore::Receiver::Finish(
    bool every_chunk) {
  const std::string what = Describe(key_);
  {
    absl::MutexLock lock(&write_mu_);
    if (file_ != nullptr) {
      // Written: closed, then mapped to be checked where it lies.
      absl::Status closed = file_->Close();
      file_.reset();
      RETURN_IF_ERROR(closed);
      if (received_ != bytes_) {
        return absl::DataLossError(absl::StrCat(what, ": ", received_, " of ",
                                                bytes_, " bytes arrived"));
      }
      ASSIGN_OR_RETURN(map_, store_->fs_->MapFile(partial_, {}));
    }
  }
  if (done_ || map_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": the transfer is over"));
  }
  if (received_ != bytes_) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", received_, " of ", bytes_, " bytes arrived"));
  }
  // Verified end to end before it counts, where it lies in memory: footer,
  // manifest, and every chunk's framing and stored bytes (an increment's
  // own; those in its bases were when they came).
  Entry e{key_, store_->PathOf(key_), bytes_};
  proto::ShardManifest m;
  {
    absl::StatusOr<proto::ShardManifest> checked = snapshot::CheckShardBytes(
        {map_->data(), map_->size()}, every_chunk, 1, /*allow_bases=*/true);
    if (!checked.ok()) {
      return absl::Status(checked.status().code(),
                          absl::StrCat(what, ": ", checked.status().message()));
    }
    m = *std::move(checked);
    if (m.job() != key_.job || m.step() != key_.step || m.rank() != key_.rank) {
      return absl::DataLossError(
          absl::StrCat(what, ": the file received is job ", m.job(), " step ",
                       m.step(), " rank ", m.rank()));
    }
    // CheckShardBytes checked the footer: it is there.
    absl::StatusOr<snapshot::Footer> footer = snapshot::DecodeFooter(
        {map_->data() + map_->size() - snapshot::kFooterSize,
         snapshot::kFooterSize});
    if (!footer.ok()) return footer.status();
    e.manifest_xxh3 = footer->manifest_xxh3;
    for (const proto::BaseShard& b : m.bases())
      e.base_steps.push_back(b.step());
  }
  map_.reset();
  io::FileSystem* fs = store_->fs_;
  // The bases are checked, and the file made visible, under the lock that a
  // Drop takes: a base present now stays while this increment does.
  absl::MutexLock lock(&store_->mu_);
  if (absl::Status bases = store_->HasBases(key_, m); !bases.ok()) {
    return absl::Status(
        bases.code(),
        absl::StrCat(what, ": an increment refused: ", bases.message()));
  }
  if (auto old = store_->files_.find(key_);
      old != store_->files_.end() &&
      old->second.manifest_xxh3 != e.manifest_xxh3) {
    // Another save of the step: what reads the copy it replaces stands
    // alone first.
    RETURN_IF_ERROR(store_->DetachDependents(key_));
  }
  RETURN_IF_ERROR(fs->Rename(partial_, e.path));
  done_ = true;
  auto [it, fresh] = store_->files_.try_emplace(key_, e);
  if (!fresh) {
    store_->used_ -= it->second.bytes;  // the older copy was replaced
    it->second = e;
  }
  return e;
}

void ReplicaStore::Release(uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  used_ -= std::min(used_, bytes);
}

absl::optional<ReplicaStore::Entry> ReplicaStore::Find(const Key& key) const {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(key);
  if (it == files_.end()) return absl::nullopt;
  return it->second;
}

std::vector<ReplicaStore::Entry> ReplicaStore::List(
    const std::string& job) const {
  absl::MutexLock lock(&mu_);
  std::vector<Entry> out;
  for (const auto& [key, e] : files_) {
    if (job.empty() || key.job == job) out.push_back(e);
  }
  return out;
}

absl::Status ReplicaStore::Drop(const Key& key) {
  Entry e;
  {
    absl::MutexLock lock(&mu_);
    auto it = files_.find(key);
    if (it == files_.end()) {
      return absl::NotFoundError(absl::StrCat("no replica of ", Describe(key)));
    }
    if (IsBase(key)) {
      return absl::FailedPreconditionError(
          absl::StrCat("the replica of ", Describe(key),
                       " is a base of a later one held here"));
    }
    e = it->second;
    files_.erase(it);
    used_ -= std::min(used_, e.bytes);
  }
  // A reader that opened it keeps its bytes until it closes the file.
  return fs_->Unlink(e.path);
}

uint64_t ReplicaStore::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

absl::StatusOr<proto::ShardRecord> ReplicaStore::RecordOf(io::FileSystem* fs,
                                                          const Entry& entry) {
  ASSIGN_OR_RETURN(std::unique_ptr<snapshot::ShardReader> reader,
                   snapshot::ShardReader::Open(fs, entry.path));
  const proto::ShardManifest& m = reader->manifest();
  proto::ShardRecord r;
  r.set_job(m.job());
  r.set_step(m.step());
  r.set_rank(m.rank());
  r.set_world_size(m.world_size());
  r.set_state(proto::SHARD_PERSISTED);
  r.set_shard_path(entry.path);
  uint64_t raw = 0, stored = 0;
  for (const proto::Item& item : m.items()) {
    proto::StagedItem* staged = r.add_items();
    *staged->mutable_item() = item;
    staged->mutable_item()->clear_chunks();
    raw += item.raw_size();
    for (const proto::ChunkInfo& c : item.chunks()) stored += c.stored_size();
  }
  r.set_raw_bytes(raw);
  r.set_stored_bytes(stored);
  return r;
}

}  // namespace ckpt::daemon
