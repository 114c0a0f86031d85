// Sealed manifests: a keyed MAC that only holders of the cluster key can
// make. A shard's manifest lists every chunk's checksums and its footer the
// manifest's checksum, so the file is covered end to end, but against
// accidents only: anyone can recompute an xxh3. A seal is HMAC-SHA256 under
// the cluster key of every manifest byte before it, appended to the manifest
// as its last field (`seal`, field 15: the key's 8-byte id, then the 32-byte
// MAC). A reader that checks it knows the manifest, and through its
// checksums every chunk, came from a holder of the key; readers that know no
// key parse the field as opaque bytes, so sealed shards stay readable by
// them.
//
// The keys are the process's: ckptd installs them at start (--cluster-key,
// and --cluster-key-old for the keys of a rotation, accepted for reads
// only). With keys installed, every manifest written is sealed with the
// current key, and every manifest checked (CheckManifest: every read of a
// shard file, every replica received, every copy served) must carry a seal
// one of the keys checks, else it is refused with PermissionDenied naming
// what is wrong. Without keys, nothing is sealed or checked.
//
// A cluster that turns keys on over checkpoints saved without one (ckptd's
// default key, agreed at its first start after an upgrade) keeps those
// readable: the keys then carry, per job, the newest step saved before the
// key existed, and an unsealed manifest of such a step still checks. Every
// later step must be sealed.
//
// Thread-safety: SealKeys is immutable; installing is thread-safe.
#ifndef CKPT_SNAPSHOT_MANIFEST_SEAL_H_
#define CKPT_SNAPSHOT_MANIFEST_SEAL_H_

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace ckpt::snapshot {

class SealKeys {
 public:
  static constexpr size_t kMinKeyBytes = 32;
  static constexpr size_t kIdBytes = 8;
  static constexpr size_t kMacBytes = 32;
  // The field as it is appended: tag, length, id, MAC.
  static constexpr size_t kSealFieldBytes = 2 + kIdBytes + kMacBytes;

  // Per job, the newest step whose shards were saved before the cluster had
  // a key (and may stay unsealed).
  using UnsealedThrough = std::map<std::string, uint64_t>;

  // From key material (at least 32 bytes): `current` seals and checks,
  // `old` only check.
  static absl::StatusOr<std::shared_ptr<const SealKeys>> FromBytes(
      const std::string& current, const std::vector<std::string>& old = {},
      UnsealedThrough unsealed_through = {});
  // From key files (their whole content, a trailing newline dropped): each
  // must be a regular file of this uid that no other user may read.
  static absl::StatusOr<std::shared_ptr<const SealKeys>> Load(
      const std::string& current_file,
      const std::vector<std::string>& old_files = {});

  // The bytes to append to `manifest` (its serialized form without a seal).
  std::string Seal(absl::string_view manifest) const;
  // Checks that `manifest` (as the file holds it) ends with a seal one of
  // the keys made over the bytes before it, or is an unsealed manifest of a
  // step saved before the key existed.
  absl::Status Check(absl::string_view manifest) const;

  // The current key's id, in hex (logs, errors).
  std::string current_id() const;

 private:
  struct Key {
    std::string bytes;
    std::array<uint8_t, kIdBytes> id;
  };
  static Key MakeKey(std::string bytes);
  // Whether an unsealed `manifest` is of a step saved before the key.
  bool SavedBeforeTheKey(absl::string_view manifest) const;

  std::vector<Key> keys_;  // current first
  UnsealedThrough unsealed_through_;
};

// The process's keys (null: none). Installed once at start by ckptd; tests
// install and remove them around what they check.
void InstallSealKeys(std::shared_ptr<const SealKeys> keys);
std::shared_ptr<const SealKeys> InstalledSealKeys();

}  // namespace ckpt::snapshot

#endif  // CKPT_SNAPSHOT_MANIFEST_SEAL_H_
