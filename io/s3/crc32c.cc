#include "io/s3/crc32c.h"

#include <isa-l/crc.h>

#include <algorithm>

#include "absl/strings/escaping.h"

namespace ckpt::io::s3 {

uint32_t Crc32c(absl::Span<const uint8_t> bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  while (!bytes.empty()) {  // ISA-L takes an int length
    const size_t n = std::min<size_t>(bytes.size(), 1u << 30);
    crc = crc32_iscsi(const_cast<unsigned char*>(bytes.data()),
                      static_cast<int>(n), crc);
    bytes.remove_prefix(n);
  }
  return crc ^ 0xFFFFFFFFu;
}

std::string Crc32cBase64(absl::Span<const uint8_t> bytes) {
  const uint32_t c = Crc32c(bytes);
  const char big_endian[4] = {static_cast<char>(c >> 24),
                              static_cast<char>(c >> 16),
                              static_cast<char>(c >> 8), static_cast<char>(c)};
  return absl::Base64Escape(absl::string_view(big_endian, 4));
}

}  // namespace ckpt::io::s3
