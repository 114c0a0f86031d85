// CRC32C (Castagnoli) of bytes, as S3's x-amz-checksum-crc32c header carries
// it (base64 of the big-endian value): the server checks each object and
// part against it. Computed with ISA-L (the CPU's CRC32 instruction).
#ifndef CKPT_IO_S3_CRC32C_H_
#define CKPT_IO_S3_CRC32C_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"

namespace ckpt::io::s3 {

uint32_t Crc32c(absl::Span<const uint8_t> bytes);
std::string Crc32cBase64(absl::Span<const uint8_t> bytes);

}  // namespace ckpt::io::s3

#endif  // CKPT_IO_S3_CRC32C_H_
