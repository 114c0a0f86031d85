#include "client/nccl_comm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace ckpt::client {
namespace {

// The one conversion of NCCL's and CUDA's error spaces here.
absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": NCCL: ", ncclGetErrorString(r)));
}
absl::Status CudaError(cudaError_t e, absl::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": CUDA: ", cudaGetErrorString(e)));
}

}  // namespace

absl::StatusOr<ncclComm_t> RebuildCommunicator(ncclComm_t old,
                                               const Epoch& previous,
                                               const Epoch& next,
                                               int cuda_device) {
  if (absl::Status s = CudaError(cudaSetDevice(cuda_device), "cudaSetDevice");
      !s.ok()) {
    return s;
  }
  // Only removals: shrink, keeping the survivors' order (the sorted order
  // Rejoin assigns ranks by).
  bool only_removals = old != nullptr && next.world_size > 0;
  std::vector<int> excluded;
  for (size_t i = 0; i < previous.members.size() && only_removals; ++i) {
    if (std::find(next.members.begin(), next.members.end(),
                  previous.members[i]) == next.members.end()) {
      excluded.push_back(static_cast<int>(i));
    }
  }
  for (const std::string& m : next.members) {
    if (std::find(previous.members.begin(), previous.members.end(), m) ==
        previous.members.end()) {
      only_removals = false;
    }
  }
  ncclComm_t comm = nullptr;
  if (only_removals && !excluded.empty()) {
    absl::Status s = NcclError(
        ncclCommShrink(old, excluded.data(), static_cast<int>(excluded.size()),
                       &comm, nullptr, NCCL_SHRINK_ABORT),
        "ncclCommShrink");
    if (s.ok()) {
      (void)ncclCommDestroy(old);
      return comm;
    }
    // Fall through: a fresh communicator from the unique id.
  }
  if (old != nullptr) (void)ncclCommAbort(old);
  if (next.nccl_unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat(
        "epoch ", next.epoch, ": the NCCL unique id has ",
        next.nccl_unique_id.size(), " bytes, not ", NCCL_UNIQUE_ID_BYTES));
  }
  ncclUniqueId id;
  std::memcpy(id.internal, next.nccl_unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  if (absl::Status s = NcclError(
          ncclCommInitRank(&comm, static_cast<int>(next.world_size), id,
                           static_cast<int>(next.rank)),
          absl::StrCat("ncclCommInitRank (epoch ", next.epoch, ", rank ",
                       next.rank, " of ", next.world_size, ")"));
      !s.ok()) {
    return s;
  }
  return comm;
}

}  // namespace ckpt::client
