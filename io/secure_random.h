// Bytes from the kernel's CSPRNG (getrandom(2)), for what must never be
// guessed: bulk-transfer tickets, cluster keys. absl::BitGen is documented
// as unfit for that.
//
// Thread-safety: thread-safe.
#ifndef CKPT_IO_SECURE_RANDOM_H_
#define CKPT_IO_SECURE_RANDOM_H_

#include <cstddef>
#include <string>

namespace ckpt::io {

// `bytes` random bytes. Aborts the process if the kernel cannot give them (a
// kernel without getrandom, or a seccomp filter): there is no weaker
// fallback for a secret.
std::string SecureRandomBytes(size_t bytes);

}  // namespace ckpt::io

#endif  // CKPT_IO_SECURE_RANDOM_H_
