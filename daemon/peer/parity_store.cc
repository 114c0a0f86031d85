#include "daemon/peer/parity_store.h"

#include <sys/stat.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/common/records.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "snapshot/erasure_code.h"
#include "snapshot/names.h"
#include "snapshot/xxh3.h"

namespace ckpt::daemon {
namespace {

constexpr absl::string_view kRecord = ".record";
constexpr absl::string_view kBlock = ".parity";

std::string Describe(const proto::ParityBlockKey& key) {
  return absl::StrCat("parity block ", key.index(), " of group ", key.group(),
                      " of job ", key.job(), " step ", key.step());
}

bool Contributed(const proto::ParityBlockRecord& r, uint32_t position) {
  for (const proto::ParityContribution& c : r.contributions()) {
    if (c.position() == position) return true;
  }
  return false;
}

// Where a block's `suffix` file lies in a store rooted at `dir`.
std::string BlockPath(const std::string& dir, const proto::ParityBlockKey& key,
                      absl::string_view suffix) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020" PRIu64 "-g%06" PRIu32 "-p%02" PRIu32,
                key.step(), key.group(), key.index());
  return io::JoinPath(io::JoinPath(dir, key.job()), absl::StrCat(name, suffix));
}

}  // namespace

ParityStore::Key ParityStore::KeyOf(const proto::ParityBlockKey& key) {
  return {key.job(), key.step(), key.group(), key.index()};
}

std::string ParityStore::PathOf(const proto::ParityBlockKey& key,
                                absl::string_view suffix) const {
  return BlockPath(dir_, key, suffix);
}

absl::StatusOr<std::unique_ptr<ParityStore>> ParityStore::Open(
    io::FileSystem* fs, std::string dir, uint64_t budget_bytes) {
  if (dir.empty()) return absl::InvalidArgumentError("parity dir is empty");
  RETURN_IF_ERROR(fs->CreatePrivateDirs(dir));
  std::unique_ptr<ParityStore> store(
      new ParityStore(fs, std::move(dir), budget_bytes));
  ASSIGN_OR_RETURN(std::vector<std::string> jobs, fs->ListDir(store->dir_));
  absl::MutexLock lock(&store->mu_);
  for (const std::string& job : jobs) {
    const std::string job_dir = io::JoinPath(store->dir_, job);
    absl::StatusOr<std::vector<std::string>> names = fs->ListDir(job_dir);
    if (!names.ok() || !snapshot::ValidateJobId(job).ok()) {
      CKPT_LOG_WARN("parity: ignoring unexpected entry {}", job_dir);
      continue;
    }
    std::set<std::string> handled;  // adopted, or dropped already
    for (const std::string& name : *names) {
      if (!absl::EndsWith(name, kRecord)) continue;
      const std::string path = io::JoinPath(job_dir, name);
      absl::StatusOr<std::string> bytes = io::ReadFileToString(fs, path);
      absl::StatusOr<proto::ParityBlockRecord> r =
          bytes.ok() ? ParseRecord<proto::ParityBlockRecord>(path, *bytes)
                     : absl::StatusOr<proto::ParityBlockRecord>(bytes.status());
      if (!r.ok() || r->key().job() != job ||
          store->PathOf(r->key(), kRecord) != path) {
        CKPT_LOG_INFO("parity: removing {} (not a block record)", path);
        (void)fs->Unlink(path);
        continue;
      }
      const std::string block_path = store->PathOf(r->key(), kBlock);
      if (r->applying_size() > 0) {
        CKPT_LOG_INFO("parity: dropping {}: a crash cut into it",
                      Describe(r->key()));
        (void)fs->Unlink(block_path);
        (void)fs->Unlink(path);
        handled.insert(io::BaseName(block_path));
        continue;
      }
      io::MapOptions options;
      absl::StatusOr<std::unique_ptr<io::MappedFile>> map =
          fs->MapFile(block_path, options);
      if (!map.ok() || (*map)->size() != r->group().stripe_bytes()) {
        CKPT_LOG_INFO("parity: dropping {}: its bytes are missing or short",
                      Describe(r->key()));
        (void)fs->Unlink(block_path);
        (void)fs->Unlink(path);
        handled.insert(io::BaseName(block_path));
        continue;
      }
      Block b;
      b.record = *std::move(r);
      b.map = *std::move(map);
      b.epoch = store->next_epoch_++;
      store->used_ += b.record.group().stripe_bytes();
      handled.insert(io::BaseName(block_path));
      store->blocks_[KeyOf(b.record.key())] = std::move(b);
    }
    for (const std::string& name : *names) {
      if (handled.count(name) || absl::EndsWith(name, kRecord)) continue;
      CKPT_LOG_INFO("parity: removing {} (no record)",
                    io::JoinPath(job_dir, name));
      (void)fs->Unlink(io::JoinPath(job_dir, name));
    }
  }
  return store;
}

ParityStore::~ParityStore() = default;

std::vector<ParityStore::BlockCheck> ParityStore::Verify(
    io::FileSystem* fs, const std::string& dir, const std::string& job,
    absl::optional<uint64_t> step) {
  std::vector<BlockCheck> checks;
  const std::string job_dir = io::JoinPath(dir, job);
  absl::StatusOr<std::vector<std::string>> names = fs->ListDir(job_dir);
  if (!names.ok()) return checks;  // no parity of the job here
  std::sort(names->begin(), names->end());
  for (const std::string& name : *names) {
    if (!absl::EndsWith(name, kRecord)) continue;
    BlockCheck c;
    const std::string record_path = io::JoinPath(job_dir, name);
    c.path = record_path;
    absl::StatusOr<std::string> bytes = io::ReadFileToString(fs, record_path);
    absl::StatusOr<proto::ParityBlockRecord> r =
        bytes.ok() ? ParseRecord<proto::ParityBlockRecord>(record_path, *bytes)
                   : absl::StatusOr<proto::ParityBlockRecord>(bytes.status());
    if (!r.ok()) {
      c.problems.push_back(std::string(r.status().message()));
      checks.push_back(std::move(c));
      continue;
    }
    c.key = r->key();
    if (step.has_value() && c.key.step() != *step) continue;
    c.complete = r->complete();
    c.path = BlockPath(dir, c.key, kBlock);
    if (c.key.job() != job || BlockPath(dir, c.key, kRecord) != record_path) {
      c.problems.push_back(absl::StrCat(record_path, " names ", Describe(c.key),
                                        ", not itself"));
    } else if (c.complete) {
      io::MapOptions options;
      options.writable = false;
      absl::StatusOr<std::unique_ptr<io::MappedFile>> map =
          fs->MapFile(c.path, options);
      if (!map.ok()) {
        c.problems.push_back(
            absl::StrCat(Describe(c.key), ": ", map.status().message()));
      } else if ((*map)->size() != r->group().stripe_bytes()) {
        c.problems.push_back(absl::StrCat(Describe(c.key), ": ", (*map)->size(),
                                          " bytes, not its group's ",
                                          r->group().stripe_bytes()));
      } else if (XXH3_64bits((*map)->data(), (*map)->size()) !=
                 r->block_xxh3()) {
        c.problems.push_back(absl::StrCat(
            Describe(c.key),
            ": its bytes changed since it completed (XXH3 mismatch)"));
      }
    }
    checks.push_back(std::move(c));
  }
  return checks;
}

absl::Status ParityStore::WriteRecord(const proto::ParityBlockRecord& record) {
  const std::string path = PathOf(record.key(), kRecord);
  const std::string tmp = path + ".tmp";
  RETURN_IF_ERROR(io::WriteStringToFile(fs_, tmp, record.SerializeAsString()));
  return fs_->Rename(tmp, path);
}

absl::StatusOr<std::unique_ptr<ParityStore::Contribution>>
ParityStore::Contribute(const proto::ParityBlockKey& key,
                        const proto::ParityGroup& group, uint32_t position) {
  RETURN_IF_ERROR(snapshot::ValidateJobId(key.job()));
  if (position >= static_cast<uint32_t>(group.data_size()) ||
      key.index() >= static_cast<uint32_t>(group.parity_nodes_size()) ||
      group.stripe_bytes() == 0 || key.group() != group.group()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(key), ": data block ", position,
                     " is not one of its group's ", group.data_size(), " (",
                     group.parity_nodes_size(), " parity blocks, group ",
                     group.group(), ", ", group.stripe_bytes(), " bytes)"));
  }
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(KeyOf(key));
  if (it == blocks_.end()) {
    if (used_ + group.stripe_bytes() > budget_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          Describe(key), ": ", group.stripe_bytes(), " bytes do not fit (",
          used_, " of ", budget_, " bytes of parity memory used)"));
    }
    RETURN_IF_ERROR(fs_->CreateDirs(io::JoinPath(dir_, key.job())));
    Block b;
    b.epoch = next_epoch_++;
    *b.record.mutable_key() = key;
    *b.record.mutable_group() = group;
    const std::string path = PathOf(key, kBlock);
    (void)fs_->Unlink(path);
    io::MapOptions options;
    options.create_size = group.stripe_bytes();
    ASSIGN_OR_RETURN(b.map, fs_->MapFile(path, options));
    used_ += group.stripe_bytes();
    it = blocks_.emplace(KeyOf(key), std::move(b)).first;
  } else if (it->second.record.group().SerializeAsString() !=
             group.SerializeAsString()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(key),
        " is held for another plan of the step (its group differs)"));
  }
  Block& b = it->second;
  if (Contributed(b.record, position)) {
    return absl::AlreadyExistsError(absl::StrCat(
        Describe(key), " has data block ", position, "'s contribution"));
  }
  if (std::count(b.record.applying().begin(), b.record.applying().end(),
                 position) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        Describe(key), ": data block ", position, " is contributing now"));
  }
  b.record.add_applying(position);
  RETURN_IF_ERROR(WriteRecord(b.record));
  return std::unique_ptr<Contribution>(new Contribution(
      this, key, position, group.data(position).file_bytes(), b.epoch));
}

ParityStore::Block* ParityStore::Current(const Contribution& c) {
  auto it = blocks_.find(KeyOf(c.key_));
  if (it == blocks_.end() || it->second.epoch != c.epoch_) return nullptr;
  return &it->second;
}

absl::Status ParityStore::Empty(Block& b) {
  b.epoch = next_epoch_++;
  b.record.clear_contributions();
  b.record.clear_applying();
  b.record.set_complete(false);
  b.record.clear_block_xxh3();
  b.map.reset();
  const std::string path = PathOf(b.record.key(), kBlock);
  (void)fs_->Unlink(path);
  io::MapOptions options;
  options.create_size = b.record.group().stripe_bytes();
  absl::StatusOr<std::unique_ptr<io::MappedFile>> map =
      fs_->MapFile(path, options);
  if (!map.ok()) {
    // No bytes: the record says nothing was contributed, and a reopen drops
    // the block.
    CKPT_LOG_WARN("{}: recreating its bytes: {}", Describe(b.record.key()),
                  map.status().ToString());
    return map.status();
  }
  b.map = *std::move(map);
  return WriteRecord(b.record);
}

void ParityStore::Abandon(Contribution& c) {
  absl::MutexLock lock(&mu_);
  Block* b = Current(c);
  if (b == nullptr) return;  // emptied already, or dropped
  if (c.received_ > 0) {
    CKPT_LOG_WARN(
        "{}: data block {}'s contribution was cut short after {} of "
        "{} bytes; emptying the block",
        Describe(c.key_), c.position_, c.received_, c.bytes_);
    (void)Empty(*b);
    return;
  }
  auto* applying = b->record.mutable_applying();
  applying->erase(std::remove(applying->begin(), applying->end(), c.position_),
                  applying->end());
  (void)WriteRecord(b->record);
}

ParityStore::Contribution::Contribution(ParityStore* store,
                                        proto::ParityBlockKey key,
                                        uint32_t position, uint64_t bytes,
                                        uint64_t epoch)
    : store_(store),
      key_(std::move(key)),
      position_(position),
      bytes_(bytes),
      epoch_(epoch),
      hash_(XXH3_createState()) {
  XXH3_64bits_reset(hash_);
}

ParityStore::Contribution::~Contribution() {
  if (!done_) store_->Abandon(*this);
  XXH3_freeState(hash_);
}

absl::Status ParityStore::Contribution::Append(absl::Span<const uint8_t> data) {
  if (done_) return absl::FailedPreconditionError("contribution finished");
  if (received_ + data.size() > bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe(key_), ": data block ", position_,
                     " sent more than its ", bytes_, " bytes"));
  }
  XXH3_64bits_update(hash_, data.data(), data.size());
  absl::MutexLock lock(&store_->mu_);
  Block* b = store_->Current(*this);
  if (b == nullptr) {
    return absl::AbortedError(absl::StrCat(
        Describe(key_), " was emptied while data block ", position_,
        " contributed (another contribution was cut short); send it again"));
  }
  snapshot::ErasureCode::Accumulate(data, b->map->data() + received_);
  received_ += data.size();
  return absl::OkStatus();
}

absl::StatusOr<proto::ParityBlockRecord> ParityStore::Contribution::Finish(
    uint64_t xxh3) {
  if (done_) return absl::FailedPreconditionError("contribution finished");
  if (received_ != bytes_) {
    return absl::DataLossError(absl::StrCat(Describe(key_), ": data block ",
                                            position_, " sent ", received_,
                                            " of its ", bytes_, " bytes"));
  }
  absl::MutexLock lock(&store_->mu_);
  Block* b = store_->Current(*this);
  if (b == nullptr) {
    return absl::AbortedError(
        absl::StrCat(Describe(key_), " was emptied while data block ",
                     position_, " contributed; send it again"));
  }
  done_ = true;
  if (XXH3_64bits_digest(hash_) != xxh3) {
    CKPT_LOG_WARN(
        "{}: data block {}'s contribution does not hash to what "
        "its sender said; emptying the block",
        Describe(key_), position_);
    (void)store_->Empty(*b);
    return absl::DataLossError(
        absl::StrCat(Describe(key_), ": data block ", position_,
                     "'s contribution arrived damaged (checksum mismatch)"));
  }
  auto* applying = b->record.mutable_applying();
  applying->erase(std::remove(applying->begin(), applying->end(), position_),
                  applying->end());
  proto::ParityContribution* c = b->record.add_contributions();
  c->set_position(position_);
  c->set_xxh3(xxh3);
  if (b->record.contributions_size() == b->record.group().data_size()) {
    b->record.set_complete(true);
    b->record.set_block_xxh3(XXH3_64bits(b->map->data(), b->map->size()));
  }
  RETURN_IF_ERROR(store_->WriteRecord(b->record));
  return b->record;
}

absl::StatusOr<proto::ParityBlockRecord> ParityStore::Record(
    const proto::ParityBlockKey& key) const {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(KeyOf(key));
  if (it == blocks_.end()) {
    return absl::NotFoundError(
        absl::StrCat("this node holds no ", Describe(key)));
  }
  return it->second.record;
}

absl::StatusOr<ParityStore::Complete> ParityStore::OpenComplete(
    const proto::ParityBlockKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(KeyOf(key));
  if (it == blocks_.end()) {
    return absl::NotFoundError(
        absl::StrCat("this node holds no ", Describe(key)));
  }
  if (!it->second.record.complete()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Describe(key), " is not complete (",
        it->second.record.contributions_size(), " of ",
        it->second.record.group().data_size(), " data blocks contributed)"));
  }
  Complete out;
  io::MapOptions options;
  options.writable = false;
  out.path = PathOf(key, kBlock);
  ASSIGN_OR_RETURN(out.map, fs_->MapFile(out.path, options));
  out.record = it->second.record;
  return out;
}

std::vector<proto::ParityBlockRecord> ParityStore::List(
    const std::string& job) const {
  absl::MutexLock lock(&mu_);
  std::vector<proto::ParityBlockRecord> out;
  for (const auto& [key, b] : blocks_) {
    if (job.empty() || std::get<0>(key) == job) out.push_back(b.record);
  }
  return out;
}

absl::Status ParityStore::Drop(const proto::ParityBlockKey& key) {
  absl::MutexLock lock(&mu_);
  auto it = blocks_.find(KeyOf(key));
  if (it == blocks_.end()) {
    return absl::NotFoundError(
        absl::StrCat("this node holds no ", Describe(key)));
  }
  // Contributions under way find no block and fail.
  used_ -= it->second.record.group().stripe_bytes();
  blocks_.erase(it);
  (void)fs_->Unlink(PathOf(key, kRecord));
  return fs_->Unlink(PathOf(key, kBlock));
}

uint64_t ParityStore::used_bytes() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

}  // namespace ckpt::daemon
