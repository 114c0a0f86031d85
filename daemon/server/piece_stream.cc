#include "daemon/server/piece_stream.h"

#include <algorithm>
#include <string>

#include "daemon/common/grpc_status.h"

namespace ckpt::daemon {
namespace {

constexpr size_t kPieceBytes = 4 << 20;

}  // namespace

grpc::Status SendPieces(grpc::ServerContext* ctx,
                        grpc::ServerWriter<proto::ShardPiece>* writer,
                        uint64_t size, const char* what, CallWatchdog* watchdog,
                        io::RateLimiter* send_rate, const PieceRead& read) {
  auto watch = watchdog->Start(ctx, what);
  proto::ShardPiece piece;
  piece.set_file_bytes(size);
  for (uint64_t at = 0; at < size && !ctx->IsCancelled();) {
    const size_t n =
        static_cast<size_t>(std::min<uint64_t>(kPieceBytes, size - at));
    std::string* data = piece.mutable_data();
    data->resize(n);
    absl::Status got =
        read(at, absl::MakeSpan(reinterpret_cast<uint8_t*>(data->data()), n));
    if (!got.ok()) return ToGrpc(got);
    io::AcquireSend(send_rate, n);
    if (!writer->Write(piece)) break;
    watch->Touch();
    at += n;
    piece.Clear();
  }
  return grpc::Status::OK;
}

}  // namespace ckpt::daemon
