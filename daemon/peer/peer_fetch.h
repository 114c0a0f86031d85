// FetchFromPeer is the one way a node takes a file from a peer (a shard for a
// restore or a stand-in, a block for a parity rebuild): offered as a bulk
// transfer over plain TCP when the peer can, else streamed over gRPC (a peer
// under mutual TLS refuses offers with FAILED_PRECONDITION: its bytes stay
// inside TLS). Either way the bytes go, in order, into a sink the caller opens
// once the size is known, and a size other than the one expected is refused
// before any byte is taken.
//
// Thread-safety: functions; calls may run at once.
#ifndef CKPT_DAEMON_PEER_PEER_FETCH_H_
#define CKPT_DAEMON_PEER_PEER_FETCH_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/optional.h"
#include "absl/types/span.h"
#include "proto/peer.grpc.pb.h"

namespace ckpt::daemon {

// When a transfer of `bytes` between peers should be over: 30 s, plus the
// bytes at 20 MiB/s.
absl::Time TransferDeadline(uint64_t bytes);

// Where a fetched file's bytes go, in order: `space` gives the next region to
// fill (it may wait for room), `arrived` takes how much of it was filled.
struct FetchSink {
  std::function<absl::StatusOr<absl::Span<uint8_t>>()> space;
  std::function<void(uint64_t)> arrived;
};

// The peer's two calls for one file: an offer of a bulk transfer, and a
// server stream of ShardPiece whose first piece says the size.
struct PeerFileCalls {
  std::function<grpc::Status(grpc::ClientContext*, proto::ShardOffer*)> offer;
  std::function<std::unique_ptr<grpc::ClientReader<proto::ShardPiece>>(
      grpc::ClientContext*)>
      stream;
};

// Fetches the file the peer at `address` (host:port of its peer service)
// offers through `calls`. `size`: the size expected (nullopt: the peer's
// word). `open(size)` is called once, before any byte arrives. Errors start
// with `what`. `via`, when given, is told which way the bytes came ("a bulk
// transfer" or "gRPC"). A bulk transfer fails once the peer sends nothing for
// `stall`.
absl::Status FetchFromPeer(
    const std::string& address, absl::optional<uint64_t> size,
    const std::string& what, const PeerFileCalls& calls,
    const std::function<absl::StatusOr<FetchSink>(uint64_t size)>& open,
    std::string* via = nullptr, absl::Duration stall = absl::Seconds(30));

}  // namespace ckpt::daemon

#endif  // CKPT_DAEMON_PEER_PEER_FETCH_H_
