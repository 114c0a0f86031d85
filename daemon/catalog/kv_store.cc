#include "daemon/catalog/kv_store.h"

#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/write_batch.h>

#include "absl/strings/str_cat.h"

namespace ckpt::daemon {
namespace {

// The one place where RocksDB's status space becomes absl::Status.
absl::Status FromRocks(const rocksdb::Status& s, absl::string_view what) {
  if (s.ok()) return absl::OkStatus();
  absl::StatusCode code = absl::StatusCode::kInternal;
  if (s.IsNotFound()) code = absl::StatusCode::kNotFound;
  if (s.IsCorruption()) code = absl::StatusCode::kDataLoss;
  if (s.IsIOError())
    code = s.IsNoSpace() ? absl::StatusCode::kResourceExhausted
                         : absl::StatusCode::kUnavailable;
  if (s.IsInvalidArgument()) code = absl::StatusCode::kInvalidArgument;
  if (s.IsBusy() || s.IsTimedOut() || s.IsTryAgain())
    code = absl::StatusCode::kUnavailable;
  return absl::Status(code, absl::StrCat("catalog ", what, ": ", s.ToString()));
}

rocksdb::WriteOptions Synced() {
  rocksdb::WriteOptions options;
  options.sync = true;
  return options;
}

rocksdb::Slice S(absl::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

}  // namespace

KvStore::KvStore(std::string dir, rocksdb::DB* db)
    : dir_(std::move(dir)), db_(db) {}
KvStore::~KvStore() = default;

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Open(const std::string& dir) {
  rocksdb::Options options;
  options.create_if_missing = true;
  options.paranoid_checks = true;
  options.max_open_files = 256;
  options.keep_log_file_num = 4;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::Open(options, dir, &db);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", dir));
  return std::unique_ptr<KvStore>(new KvStore(dir, db));
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::OpenReadOnly(
    const std::string& dir) {
  rocksdb::Options options;
  options.paranoid_checks = true;
  options.max_open_files = 256;
  rocksdb::DB* db = nullptr;
  rocksdb::Status s = rocksdb::DB::OpenForReadOnly(options, dir, &db);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", dir, " read-only"));
  return std::unique_ptr<KvStore>(new KvStore(dir, db));
}

absl::StatusOr<absl::optional<std::string>> KvStore::Get(
    absl::string_view key) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), S(key), &value);
  if (s.IsNotFound()) return absl::optional<std::string>();
  if (!s.ok()) return FromRocks(s, absl::StrCat("get ", key));
  return absl::optional<std::string>(std::move(value));
}

absl::Status KvStore::Put(absl::string_view key, absl::string_view value,
                          bool sync) {
  rocksdb::WriteOptions options;
  options.sync = sync;
  return FromRocks(db_->Put(options, S(key), S(value)),
                   absl::StrCat("put ", key));
}

absl::Status KvStore::Delete(absl::string_view key) {
  return FromRocks(db_->Delete(Synced(), S(key)), absl::StrCat("delete ", key));
}

absl::Status KvStore::Write(const Batch& batch) {
  rocksdb::WriteBatch wb;
  for (const auto& [k, v] : batch.puts) wb.Put(S(k), S(v));
  for (const auto& k : batch.deletes) wb.Delete(S(k));
  return FromRocks(db_->Write(Synced(), &wb), "write batch");
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> KvStore::Scan(
    absl::string_view prefix) {
  std::vector<std::pair<std::string, std::string>> out;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(S(prefix)); it->Valid() && it->key().starts_with(S(prefix));
       it->Next()) {
    out.emplace_back(it->key().ToString(), it->value().ToString());
  }
  if (!it->status().ok())
    return FromRocks(it->status(), absl::StrCat("scan ", prefix));
  return out;
}

}  // namespace ckpt::daemon
