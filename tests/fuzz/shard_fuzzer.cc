// Fuzzes the whole reader: the input is a shard file, opened and verified end
// to end.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "io/file_system.h"
#include "io/thread_pool.h"
#include "snapshot/shard_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ckpt::io::ThreadPool* pool = new ckpt::io::ThreadPool(1);
  static ckpt::io::FileSystem* fs =
      ckpt::io::NewPosixFileSystem({.use_io_uring = false}).release();
  static const std::string path =
      "/dev/shm/ckpt-shard-fuzz-" + std::to_string(::getpid());
  if (!ckpt::io::WriteStringToFile(fs, path,
                                   {reinterpret_cast<const char*>(data), size})
           .ok()) {
    return 0;
  }
  ckpt::snapshot::ShardReaderOptions options{.direct_io = false, .pool = pool};
  auto reader = ckpt::snapshot::ShardReader::Open(fs, path, options);
  if (reader.ok()) (void)(*reader)->VerifyAll();
  // Not left in /dev/shm when the fuzzer stops.
  (void)fs->Unlink(path);
  return 0;
}
