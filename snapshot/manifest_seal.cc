#include "snapshot/manifest_seal.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "io/status_macros.h"
#include "proto/manifest.pb.h"

namespace ckpt::snapshot {
namespace {

// Field 15, wire type 2 (length-delimited), then the length: both one byte.
constexpr uint8_t kSealTag = (15 << 3) | 2;

std::array<uint8_t, SealKeys::kMacBytes> Mac(const std::string& key,
                                             absl::string_view data) {
  std::array<uint8_t, SealKeys::kMacBytes> mac{};
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(),
       mac.data(), &n);
  return mac;
}

std::string Hex(const uint8_t* bytes, size_t n) {
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(bytes), n));
}

absl::StatusOr<std::string> ReadKeyFile(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(
        absl::StrCat("cluster key ", file, " is not a readable file"));
  }
  if (st.st_uid != ::geteuid() || (st.st_mode & 077) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cluster key %s must be owned by uid %d and readable by it alone "
        "(it is uid %d, mode %04o): chmod 600",
        file, ::geteuid(), st.st_uid, st.st_mode & 0777));
  }
  std::ifstream in(file, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  std::string key = bytes.str();
  while (!key.empty() && (key.back() == '\n' || key.back() == '\r')) {
    key.pop_back();
  }
  if (key.size() < SealKeys::kMinKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cluster key ", file, " holds ", key.size(),
                     " bytes; at least ", SealKeys::kMinKeyBytes,
                     " are needed (tools/ckpt-certs cluster-key "
                     "makes one)"));
  }
  return key;
}

absl::Mutex installed_mu(absl::kConstInit);
std::shared_ptr<const SealKeys>& Installed()
    ABSL_EXCLUSIVE_LOCKS_REQUIRED(installed_mu) {
  static auto* keys = new std::shared_ptr<const SealKeys>();
  return *keys;
}

}  // namespace

SealKeys::Key SealKeys::MakeKey(std::string bytes) {
  Key k;
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_Digest(bytes.data(), bytes.size(), digest, &n, EVP_sha256(), nullptr);
  std::memcpy(k.id.data(), digest, kIdBytes);
  k.bytes = std::move(bytes);
  return k;
}

absl::StatusOr<std::shared_ptr<const SealKeys>> SealKeys::FromBytes(
    const std::string& current, const std::vector<std::string>& old,
    UnsealedThrough unsealed_through) {
  auto keys = std::shared_ptr<SealKeys>(new SealKeys());
  keys->unsealed_through_ = std::move(unsealed_through);
  keys->keys_.push_back(MakeKey(current));
  for (const std::string& k : old) {
    keys->keys_.push_back(MakeKey(k));
  }
  for (const Key& k : keys->keys_) {
    if (k.bytes.size() < kMinKeyBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a cluster key needs at least ", kMinKeyBytes, " bytes"));
    }
  }
  return std::shared_ptr<const SealKeys>(std::move(keys));
}

absl::StatusOr<std::shared_ptr<const SealKeys>> SealKeys::Load(
    const std::string& current_file,
    const std::vector<std::string>& old_files) {
  ASSIGN_OR_RETURN(std::string current, ReadKeyFile(current_file));
  std::vector<std::string> old;
  for (const std::string& f : old_files) {
    ASSIGN_OR_RETURN(old.emplace_back(), ReadKeyFile(f));
  }
  return FromBytes(current, old);
}

std::string SealKeys::Seal(absl::string_view manifest) const {
  const Key& key = keys_.front();
  const std::array<uint8_t, kMacBytes> mac = Mac(key.bytes, manifest);
  std::string field;
  field.reserve(kSealFieldBytes);
  field.push_back(static_cast<char>(kSealTag));
  field.push_back(static_cast<char>(kIdBytes + kMacBytes));
  field.append(reinterpret_cast<const char*>(key.id.data()), kIdBytes);
  field.append(reinterpret_cast<const char*>(mac.data()), kMacBytes);
  return field;
}

absl::Status SealKeys::Check(absl::string_view manifest) const {
  if (manifest.size() < kSealFieldBytes ||
      static_cast<uint8_t>(manifest[manifest.size() - kSealFieldBytes]) !=
          kSealTag ||
      static_cast<uint8_t>(manifest[manifest.size() - kSealFieldBytes + 1]) !=
          kIdBytes + kMacBytes) {
    if (SavedBeforeTheKey(manifest)) return absl::OkStatus();
    return absl::PermissionDeniedError(
        "manifest is not sealed: it was written without the cluster key (by "
        "a node started with --cluster-key none, or forged)");
  }
  const absl::string_view covered =
      manifest.substr(0, manifest.size() - kSealFieldBytes);
  const auto* id = reinterpret_cast<const uint8_t*>(manifest.data()) +
                   manifest.size() - kIdBytes - kMacBytes;
  const uint8_t* mac = id + kIdBytes;
  for (const Key& key : keys_) {
    if (std::memcmp(key.id.data(), id, kIdBytes) != 0) continue;
    const std::array<uint8_t, kMacBytes> want = Mac(key.bytes, covered);
    if (CRYPTO_memcmp(want.data(), mac, kMacBytes) == 0) {
      return absl::OkStatus();
    }
    return absl::PermissionDeniedError(
        absl::StrCat("manifest seal does not match under cluster key ",
                     Hex(id, kIdBytes), ": the shard was altered or forged"));
  }
  return absl::PermissionDeniedError(
      absl::StrCat("manifest is sealed with cluster key ", Hex(id, kIdBytes),
                   ", which this node does not hold (give it as "
                   "--cluster-key-old during a rotation)"));
}

bool SealKeys::SavedBeforeTheKey(absl::string_view manifest) const {
  if (unsealed_through_.empty()) return false;
  proto::ShardManifest parsed;
  if (!parsed.ParseFromArray(manifest.data(),
                             static_cast<int>(manifest.size()))) {
    return false;
  }
  auto it = unsealed_through_.find(parsed.job());
  return it != unsealed_through_.end() && parsed.step() <= it->second;
}

std::string SealKeys::current_id() const {
  return Hex(keys_.front().id.data(), kIdBytes);
}

void InstallSealKeys(std::shared_ptr<const SealKeys> keys) {
  absl::MutexLock lock(&installed_mu);
  Installed() = std::move(keys);
}

std::shared_ptr<const SealKeys> InstalledSealKeys() {
  absl::MutexLock lock(&installed_mu);
  return Installed();
}

}  // namespace ckpt::snapshot
