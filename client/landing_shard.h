// Opening the shard file a restore reads, as GetShard described it: the file
// as it is, or, when ckptd lands it from the shared tier's object store as
// it is read (`lands_on_demand`), through a file whose every read first asks
// ckptd for its byte range (LandRange) and then copies the landed bytes out
// of the tmpfs file. Those reads run on threads of the file's own, so that
// the reader's window keeps as many ranged GETs in flight: the copy streams
// into the rank chunk by chunk, and a resharded restore lands only the
// chunks of the boxes it reads. Every chunk is checked by the reader.
#ifndef CKPT_CLIENT_LANDING_SHARD_H_
#define CKPT_CLIENT_LANDING_SHARD_H_

#include <memory>

#include "absl/status/statusor.h"
#include "proto/catalog.pb.h"
#include "snapshot/shard_reader.h"

namespace ckpt::client {

class CheckpointerRpc;

absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> OpenShardReader(
    CheckpointerRpc& rpc, const proto::ShardRecord& shard);

}  // namespace ckpt::client

#endif  // CKPT_CLIENT_LANDING_SHARD_H_
