// NCCL after an elastic restart (compiled when NCCL is found): the old
// communicator is torn down without a collective (its peers may be dead) and
// the new epoch's is built, by shrinking the old one when the new epoch only
// lost members, else from the epoch's unique id (ncclCommInitRank).
//
//   auto epoch = Rejoin({...});
//   comm = *RebuildCommunicator(comm, previous, *epoch, device);
//
// Thread-safety: call from the thread that owns the communicator.
#ifndef CKPT_CLIENT_NCCL_COMM_H_
#define CKPT_CLIENT_NCCL_COMM_H_

#include <nccl.h>

#include "absl/status/statusor.h"
#include "client/elastic.h"

namespace ckpt::client {

// `old` may be null (first epoch, or a process that just joined);
// `previous` is the epoch `old` was built for.
absl::StatusOr<ncclComm_t> RebuildCommunicator(ncclComm_t old,
                                               const Epoch& previous,
                                               const Epoch& next,
                                               int cuda_device);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_NCCL_COMM_H_
