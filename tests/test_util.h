// Helpers shared by the tests: temporary directories that clean up after
// themselves, and seeded randomness whose seed is printed (and can be forced
// with CKPT_TEST_SEED to replay a failure).
#ifndef CKPT_TESTS_TEST_UTIL_H_
#define CKPT_TESTS_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "io/aligned_buffer.h"

namespace ckpt::testing {

// A fresh directory under $TEST_TMPDIR or /tmp, removed with everything in it
// on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The seed for this test: CKPT_TEST_SEED if set, else random. Printed to stdout
// either way.
uint64_t TestSeed();
std::vector<uint8_t> RandomBytes(std::mt19937_64& rng, size_t n);
// Bytes of the file, or a test failure.
std::string ReadAll(const std::string& path);
void WriteAll(const std::string& path, const std::string& contents);
// `s` in a buffer io::WritableFile::Write takes.
io::AlignedBuffer Text(absl::string_view s);

}  // namespace ckpt::testing

#endif  // CKPT_TESTS_TEST_UTIL_H_
