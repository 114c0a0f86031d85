#include "io/secure_random.h"

#include <sys/random.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "io/logging.h"

namespace ckpt::io {

std::string SecureRandomBytes(size_t bytes) {
  std::string out(bytes, '\0');
  for (size_t at = 0; at < bytes;) {
    const ssize_t got = ::getrandom(out.data() + at, bytes - at, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      CKPT_LOG_ERROR("getrandom: {}", std::strerror(errno));
      std::abort();
    }
    at += static_cast<size_t>(got);
  }
  return out;
}

}  // namespace ckpt::io
