// SendPieces: the bytes a peer fetches over the peer service's gRPC stream
// (a shard, a parity block, a version's file), sent in pieces of 4 MiB, each
// drawn on the node's send cap (--peer-send-rate) and reported to the idle
// watchdog, so a stalled fetch is cancelled and a fast one cannot starve the
// job's own traffic.
//
// Thread-safety: a free function; one call per stream.
#ifndef CKPT_DAEMON_SERVER_PIECE_STREAM_H_
#define CKPT_DAEMON_SERVER_PIECE_STREAM_H_

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "daemon/server/call_watchdog.h"
#include "io/rate_limiter.h"
#include "proto/peer.pb.h"

namespace ckpt::daemon {

// Reads the bytes at `at` into `dst`.
using PieceRead = std::function<absl::Status(uint64_t at, absl::Span<uint8_t>)>;

// Sends `size` bytes, each piece read by `read`; `what` names the call for
// the watchdog; `send_rate` null: uncapped. Stops early, OK, when the caller
// went away.
grpc::Status SendPieces(grpc::ServerContext* ctx,
                        grpc::ServerWriter<proto::ShardPiece>* writer,
                        uint64_t size, const char* what, CallWatchdog* watchdog,
                        io::RateLimiter* send_rate, const PieceRead& read);

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_SERVER_PIECE_STREAM_H_
