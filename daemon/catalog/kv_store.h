// KvStore is the daemon's durable, ordered key-value store: one RocksDB
// database holding the catalog and the embedded coordination store. Every write
// is synced to RocksDB's WAL before it returns, so whatever a caller was told
// survives a daemon crash or a power loss. Batches apply atomically. RocksDB's
// status space is converted to absl::Status only here.
//
// Thread-safety: thread-safe (RocksDB is); read-modify-write sequences need the
// caller's lock.
#ifndef CKPT_DAEMON_CATALOG_KV_STORE_H_
#define CKPT_DAEMON_CATALOG_KV_STORE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/optional.h"

namespace rocksdb {
class DB;
}

namespace ckpt::daemon {

class KvStore {
 public:
  // Opens (creating if needed) the database in `dir`.
  static absl::StatusOr<std::unique_ptr<KvStore>> Open(const std::string& dir);
  // Opens an existing database for reading only, also while a ckptd has it
  // open (RocksDB takes no lock for this): what it sees is the state as of the
  // open. Writes fail.
  static absl::StatusOr<std::unique_ptr<KvStore>> OpenReadOnly(
      const std::string& dir);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  absl::StatusOr<absl::optional<std::string>> Get(absl::string_view key);
  // `sync` false skips the WAL fsync: for records whose loss in a crash is
  // harmless (they describe work that recovery discards anyway).
  absl::Status Put(absl::string_view key, absl::string_view value,
                   bool sync = true);
  absl::Status Delete(absl::string_view key);

  // Puts and deletes applied atomically, in order.
  struct Batch {
    std::vector<std::pair<std::string, std::string>> puts;
    std::vector<std::string> deletes;
  };
  absl::Status Write(const Batch& batch);

  // Every (key, value) whose key starts with `prefix`, in key order.
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> Scan(
      absl::string_view prefix);

  const std::string& dir() const { return dir_; }

 private:
  KvStore(std::string dir, rocksdb::DB* db);
  const std::string dir_;
  std::unique_ptr<rocksdb::DB> db_;
};

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_CATALOG_KV_STORE_H_
