// Exports one committed step of a job as full (unsharded) tensors: every
// rank's box of each tensor is read (from its persisted shard, verified chunk
// by chunk, or from its memory-tier slot when the shard is not persisted yet)
// and placed into the global tensor, which is written to a safetensors file.
// Byte items become U8 tensors named "<item>@rank<r>". The step must be
// committed and the ranks' boxes must cover every element exactly once.
//
// Thread-safety: one export per call; it runs on the calling thread.
#ifndef CKPT_TOOLS_EXPORT_H_
#define CKPT_TOOLS_EXPORT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "io/file_system.h"
#include "tools/data_dir_view.h"

namespace ckpt::tools {

struct ExportStats {
  int tensors = 0;
  uint64_t bytes = 0;
};

absl::StatusOr<ExportStats> ExportSafetensors(
    DataDirView& view, const std::string& job, uint64_t step,
    const std::string& out,
    const std::function<void(int done, int total)>& progress = nullptr);

// The same from the copies `world` ranks saved of `step` in a shared tier's
// job folder `job_dir` (a directory, or an object store's prefix through its
// file system); the caller checked the step is committed there.
absl::StatusOr<ExportStats> ExportSafetensorsFromStore(
    io::FileSystem* fs, const std::string& job_dir, const std::string& job,
    uint64_t step, uint32_t world, const std::string& out,
    const std::function<void(int done, int total)>& progress = nullptr);

}  // namespace ckpt::tools

#endif  // CKPT_TOOLS_EXPORT_H_
