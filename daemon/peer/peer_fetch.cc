#include "daemon/peer/peer_fetch.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "daemon/common/grpc_status.h"
#include "io/bulk_transfer.h"
#include "io/host.h"
#include "io/status_macros.h"

namespace ckpt::daemon {
namespace {

// The sink's next region; never an empty one while bytes are to come.
absl::StatusOr<absl::Span<uint8_t>> Space(const FetchSink& sink,
                                          const std::string& what) {
  ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, sink.space());
  if (dst.empty()) {
    return absl::InternalError(
        absl::StrCat(what, ": no room left for the bytes still to come"));
  }
  return dst;
}

absl::Status Prefixed(const std::string& what, const absl::Status& s) {
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// The size the peer announced, checked against the one expected.
absl::Status CheckSize(const std::string& what, absl::optional<uint64_t> size,
                       uint64_t announced) {
  if (size.has_value() && announced != *size) {
    return absl::DataLossError(
        absl::StrCat(what, " is ", announced, " bytes, expected ", *size));
  }
  return absl::OkStatus();
}

// The bulk transfer the peer offered, into a sink opened for its size.
absl::Status ReadBulk(
    const std::string& address, const proto::ShardOffer& offer,
    absl::optional<uint64_t> size, const std::string& what,
    const std::function<absl::StatusOr<FetchSink>(uint64_t)>& open,
    absl::Duration stall) {
  RETURN_IF_ERROR(CheckSize(what, size, offer.file_bytes()));
  ASSIGN_OR_RETURN(std::string host, io::HostOfAddress(address));
  absl::StatusOr<std::unique_ptr<io::BulkStream>> bulk = io::BulkStream::Open(
      host, static_cast<int>(offer.port()), offer.ticket(), stall);
  if (!bulk.ok()) return Prefixed(what, bulk.status());
  const uint64_t total = (*bulk)->size();
  if (total != offer.file_bytes()) {
    return absl::DataLossError(absl::StrCat(what, ": the bulk transfer is ",
                                            total, " bytes, the offer said ",
                                            offer.file_bytes()));
  }
  ASSIGN_OR_RETURN(FetchSink sink, open(total));
  for (uint64_t got = 0; got < total;) {
    ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, Space(sink, what));
    if (dst.size() > total - got) dst = dst.subspan(0, total - got);
    if (absl::Status read = (*bulk)->Read(dst); !read.ok()) {
      return Prefixed(what, read);
    }
    got += dst.size();
    sink.arrived(dst.size());
  }
  return absl::OkStatus();
}

// Copies `data` into the sink's regions.
absl::Status Pour(absl::string_view data, const FetchSink& sink,
                  const std::string& what) {
  for (size_t at = 0; at < data.size();) {
    ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, Space(sink, what));
    const size_t n = std::min<size_t>(dst.size(), data.size() - at);
    std::memcpy(dst.data(), data.data() + at, n);
    at += n;
    sink.arrived(n);
  }
  return absl::OkStatus();
}

// The pieces of a server stream, the first one opening the sink.
absl::Status ReadStream(
    grpc::ClientContext* context, grpc::ClientReader<proto::ShardPiece>* reader,
    absl::optional<uint64_t> size, const std::string& what,
    const std::function<absl::StatusOr<FetchSink>(uint64_t)>& open) {
  absl::optional<FetchSink> sink;
  uint64_t total = 0, got = 0;
  absl::Status failed;
  proto::ShardPiece piece;
  while (failed.ok() && reader->Read(&piece)) {
    if (!sink.has_value()) {
      total = piece.file_bytes();
      failed = CheckSize(what, size, total);
      if (!failed.ok()) break;
      absl::StatusOr<FetchSink> opened = open(total);
      if (!opened.ok()) {
        failed = opened.status();
        break;
      }
      sink = *std::move(opened);
    }
    if (piece.data().size() > total - got) {
      failed = absl::DataLossError(
          absl::StrCat(what, ": more than ", total, " bytes arrived"));
      break;
    }
    failed = Pour(piece.data(), *sink, what);
    got += piece.data().size();
  }
  if (!failed.ok()) {
    context->TryCancel();
    reader->Finish();
    return failed;
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), what));
  if (!sink.has_value()) {
    return absl::DataLossError(absl::StrCat(what, ": the peer sent nothing"));
  }
  if (got != total) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", got, " of ", total, " bytes arrived"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Time TransferDeadline(uint64_t bytes) {
  return absl::Now() + absl::Seconds(30) +
         absl::Seconds(static_cast<double>(bytes) / (20 << 20));
}

absl::Status FetchFromPeer(
    const std::string& address, absl::optional<uint64_t> size,
    const std::string& what, const PeerFileCalls& calls,
    const std::function<absl::StatusOr<FetchSink>(uint64_t size)>& open,
    std::string* via, absl::Duration stall) {
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ShardOffer offer;
    grpc::Status offered = calls.offer(&context, &offer);
    if (offered.ok()) {
      if (via != nullptr) *via = "a bulk transfer";
      return ReadBulk(address, offer, size, what, open, stall);
    }
    if (offered.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        offered.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      return FromGrpc(offered, what);
    }
    // Bulk transfers are off there (mutual TLS): stream over gRPC.
  }
  if (via != nullptr) *via = "gRPC";
  grpc::ClientContext context;
  // Unknown, a shard may be as large as 4 GiB.
  context.set_deadline(
      absl::ToChronoTime(TransferDeadline(size.value_or(4ull << 30))));
  auto reader = calls.stream(&context);
  return ReadStream(&context, reader.get(), size, what, open);
}

}  // namespace ckpt::daemon
