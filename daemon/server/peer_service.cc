#include "daemon/server/peer_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/common/describe.h"
#include "daemon/common/grpc_status.h"
#include "daemon/peer/peer_authorization.h"
#include "daemon/server/call_watchdog.h"
#include "daemon/server/peer_tls.h"
#include "daemon/server/piece_stream.h"
#include "daemon/server/served_copy.h"
#include "io/host.h"
#include "io/kill_point.h"
#include "io/logging.h"
#include "io/rate_limiter.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/self_contained.h"
#include "snapshot/shard_reader.h"

namespace ckpt::daemon {
namespace {

ReplicaStore::Key KeyOf(const proto::PeerShardKey& k) {
  return {k.job(), k.step(), k.rank()};
}

class PeerService final : public proto::CkptPeer::Service {
 public:
  PeerService(CheckpointService* service, Replicator* replicator,
              io::BulkServer* bulk, ParityStore* parity, io::FileSystem* fs,
              bool tls, CallWatchdog* watchdog, io::RateLimiter* send_rate,
              absl::Duration version_stall)
      : service_(service),
        replicator_(replicator),
        bulk_(bulk),
        parity_(parity),
        fs_(fs),
        tls_(tls),
        watchdog_(watchdog),
        send_rate_(send_rate),
        version_stall_(version_stall),
        authorization_(
            [service](const std::string& job, uint64_t step) {
              return service->coordinator()->GetParityPlan(job, step);
            },
            [service](const std::string& job, uint64_t step, uint32_t rank) {
              return service->SavedHere(job, step, rank);
            }) {}

  grpc::Status PushParity(grpc::ServerContext* ctx,
                          grpc::ServerReader<proto::ParityPiece>* reader,
                          proto::PushParityResponse* resp) override {
    if (parity_ == nullptr) return NoParity();
    auto watch = watchdog_->Start(ctx, "a parity push");
    proto::ParityPiece piece;
    if (!reader->Read(&piece)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a parity push without a first piece");
    }
    if (grpc::Status in = Admit(*ctx, piece.from_node()); !in.ok()) return in;
    if (absl::Status may = authorization_.MayContribute(
            piece.block(), piece.group(), piece.position(), Callers(*ctx));
        !may.ok()) {
      return Refused(*ctx, may);
    }
    absl::StatusOr<std::unique_ptr<ParityStore::Contribution>> contribution =
        parity_->Contribute(piece.block(), piece.group(), piece.position());
    if (!contribution.ok()) return ToGrpc(contribution.status());
    for (;;) {
      absl::Status s =
          (*contribution)
              ->Append(absl::MakeConstSpan(
                  reinterpret_cast<const uint8_t*>(piece.data().data()),
                  piece.data().size()));
      if (!s.ok()) return ToGrpc(s);
      CKPT_KILL_POINT("peer.parity_piece_received");
      if (piece.last() || !reader->Read(&piece)) break;
      watch->Touch();
    }
    if (!piece.last() || ctx->IsCancelled()) {
      return grpc::Status(grpc::StatusCode::CANCELLED,
                          "a parity push ended before its last piece");
    }
    absl::StatusOr<proto::ParityBlockRecord> record =
        (*contribution)->Finish(piece.xxh3());
    if (!record.ok()) return ToGrpc(record.status());
    *resp->mutable_record() = *std::move(record);
    return grpc::Status::OK;
  }

  grpc::Status GetParityBlock(grpc::ServerContext* ctx,
                              const proto::ParityBlockRequest* req,
                              proto::ParityBlockState* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    if (parity_ == nullptr) return NoParity();
    absl::StatusOr<proto::ParityBlockRecord> record =
        parity_->Record(req->block());
    if (absl::IsNotFound(record.status())) return grpc::Status::OK;
    if (!record.ok()) return ToGrpc(record.status());
    resp->set_held(true);
    *resp->mutable_record() = *std::move(record);
    return grpc::Status::OK;
  }

  grpc::Status OfferParity(grpc::ServerContext* ctx,
                           const proto::ParityBlockRequest* req,
                           proto::ShardOffer* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    if (parity_ == nullptr) return NoParity();
    if (bulk_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "bulk transfers are off on this node (mutual TLS): "
                          "use FetchParity");
    }
    absl::StatusOr<ParityStore::Complete> block =
        parity_->OpenComplete(req->block());
    if (!block.ok()) return ToGrpc(block.status());
    absl::StatusOr<io::BulkServer::Ticket> ticket = bulk_->Offer(block->path);
    if (!ticket.ok()) return ToGrpc(ticket.status());
    resp->set_tier(proto::TIER_PEER);
    resp->set_file_bytes(ticket->bytes);
    resp->set_ticket(ticket->token);
    resp->set_port(static_cast<uint32_t>(bulk_->port()));
    return grpc::Status::OK;
  }

  grpc::Status FetchParity(
      grpc::ServerContext* ctx, const proto::ParityBlockRequest* req,
      grpc::ServerWriter<proto::ShardPiece>* writer) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    if (parity_ == nullptr) return NoParity();
    absl::StatusOr<ParityStore::Complete> block =
        parity_->OpenComplete(req->block());
    if (!block.ok()) return ToGrpc(block.status());
    const uint8_t* data = block->map->data();
    return Send(ctx, writer, block->map->size(), "a parity fetch",
                [data](uint64_t at, absl::Span<uint8_t> dst) {
                  std::memcpy(dst.data(), data + at, dst.size());
                  return absl::OkStatus();
                });
  }

  grpc::Status PullReplica(grpc::ServerContext* ctx,
                           const proto::PullReplicaRequest* req,
                           proto::PushReplicaResponse* resp) override {
    if (grpc::Status in = Admit(*ctx, req->from_node()); !in.ok()) return in;
    if (grpc::Status dial = MayDial(*ctx, req->host()); !dial.ok()) {
      return dial;
    }
    const ReplicaStore::Key key = KeyOf(req->shard());
    absl::StatusOr<PeerAuthorization::ReplicaClaim> claim =
        authorization_.ClaimReplica(key, req->from_node(),
                                    *replicator_->held());
    if (!claim.ok()) return Refused(*ctx, claim.status());
    absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> room =
        Receive(key, req->file_bytes());
    if (!room.ok()) return ToGrpc(room.status());
    std::unique_ptr<ReplicaStore::Receiver> receiver = *std::move(room);
    absl::Status got =
        io::BulkFetch(req->host(), static_cast<int>(req->port()), req->ticket(),
                      receiver->Unfilled(), absl::Seconds(30),
                      [](uint64_t) { CKPT_KILL_POINT("peer.piece_received"); });
    if (got.ok()) got = receiver->Filled(req->file_bytes());
    if (!got.ok()) {
      return ToGrpc(absl::Status(
          got.code(),
          absl::StrCat("the replica of ", Describe(key), " from node ",
                       req->from_node(), ": ", got.message())));
    }
    return Stored(key, req->from_node(), std::move(receiver), resp);
  }

  grpc::Status PushReplica(grpc::ServerContext* ctx,
                           grpc::ServerReader<proto::ReplicaPiece>* reader,
                           proto::PushReplicaResponse* resp) override {
    auto watch = watchdog_->Start(ctx, "a replica push");
    proto::ReplicaPiece piece;
    if (!reader->Read(&piece)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "a replica push without a first piece");
    }
    if (grpc::Status in = Admit(*ctx, piece.from_node()); !in.ok()) return in;
    const ReplicaStore::Key key = KeyOf(piece.shard());
    absl::StatusOr<PeerAuthorization::ReplicaClaim> claim =
        authorization_.ClaimReplica(key, piece.from_node(),
                                    *replicator_->held());
    if (!claim.ok()) return Refused(*ctx, claim.status());
    absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> receiver =
        Receive(key, piece.file_bytes());
    if (!receiver.ok()) return ToGrpc(receiver.status());
    const std::string from = piece.from_node();
    do {
      absl::Status s = (*receiver)->Append(piece.data());
      if (!s.ok()) return ToGrpc(s);
      CKPT_KILL_POINT("peer.piece_received");
      watch->Touch();
    } while (reader->Read(&piece));
    if (ctx->IsCancelled()) {
      return grpc::Status(
          grpc::StatusCode::CANCELLED,
          absl::StrCat("the push of ", Describe(key), " was cancelled"));
    }
    return Stored(key, from, *std::move(receiver), resp);
  }

  grpc::Status LocateShard(grpc::ServerContext* ctx,
                           const proto::LocateShardRequest* req,
                           proto::LocateShardResponse* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    absl::StatusOr<ServedCopy> copy = Best(KeyOf(req->shard()));
    if (absl::IsNotFound(copy.status())) {
      resp->set_tier(proto::TIER_UNSPECIFIED);
      return grpc::Status::OK;
    }
    if (!copy.ok()) return ToGrpc(copy.status());
    resp->set_tier(copy->tier);
    resp->set_file_bytes(copy->bytes);
    if (copy->tier == proto::TIER_PEER) {
      resp->set_held_manifest_xxh3(copy->held_manifest_xxh3);
      resp->set_held_file_bytes(copy->held_bytes);
    }
    if (req->with_items()) {
      absl::StatusOr<snapshot::SelfContained> view =
          snapshot::OpenSelfContained(fs_, copy->path);
      if (!view.ok()) return ToGrpc(view.status());
      proto::ShardManifest manifest;
      if (!manifest.ParseFromString(view->manifest_bytes)) {
        return ToGrpc(absl::DataLossError(
            absl::StrCat(copy->path, ": manifest does not parse")));
      }
      *resp->mutable_items() = manifest.items();
    }
    return grpc::Status::OK;
  }

  grpc::Status FetchShard(
      grpc::ServerContext* ctx, const proto::FetchShardRequest* req,
      grpc::ServerWriter<proto::ShardPiece>* writer) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    const ReplicaStore::Key key = KeyOf(req->shard());
    absl::StatusOr<ServedCopy> copy = Best(key);
    if (!copy.ok()) return ToGrpc(copy.status());
    // Opened once: garbage collection unlinking it meanwhile does not cut
    // the transfer short.
    absl::StatusOr<snapshot::SelfContained> view =
        snapshot::OpenSelfContained(fs_, copy->path);
    if (!view.ok()) return ToGrpc(view.status());
    io::ReadableFile* file = view->file.get();
    return Send(ctx, writer, view->size, "a shard fetch",
                [file](uint64_t at, absl::Span<uint8_t> dst) {
                  return file->Read(at, dst);
                });
  }

  grpc::Status FetchVersionFile(
      grpc::ServerContext* ctx, const proto::VersionFileRequest* req,
      grpc::ServerWriter<proto::ShardPiece>* writer) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    absl::StatusOr<Publisher::PeerRead> read = OpenVersionFile(*req);
    if (!read.ok()) return ToGrpc(read.status());
    std::unique_ptr<io::ReadableFile> file = std::move(read->arriving);
    uint64_t start = 0;  // an arriving file's reader starts at the offset
    if (file == nullptr) {
      absl::StatusOr<std::unique_ptr<io::ReadableFile>> placed =
          fs_->NewReadableFile(read->path, {});
      if (!placed.ok()) return ToGrpc(placed.status());
      file = *std::move(placed);
      start = read->offset;
    }
    io::ReadableFile* f = file.get();
    return Send(ctx, writer, read->bytes, "a version fetch",
                [f, start](uint64_t at, absl::Span<uint8_t> dst) {
                  return f->Read(start + at, dst);
                });
  }

  grpc::Status GetVersionFileProgress(
      grpc::ServerContext* ctx, const proto::VersionFileRequest* req,
      proto::VersionFileProgress* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    Publisher* publisher = service_->publisher();
    if (publisher == nullptr) return ToGrpc(NoPublication());
    absl::StatusOr<proto::VersionFileProgress> progress =
        publisher->ProgressOf(*req);
    if (!progress.ok()) return ToGrpc(progress.status());
    *resp = *std::move(progress);
    return grpc::Status::OK;
  }

  grpc::Status OfferVersionFile(grpc::ServerContext* ctx,
                                const proto::VersionFileRequest* req,
                                proto::ShardOffer* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    if (bulk_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "bulk transfers are off on this node (mutual TLS): "
                          "use FetchVersionFile");
    }
    absl::StatusOr<Publisher::PeerRead> read = OpenVersionFile(*req);
    if (!read.ok()) return ToGrpc(read.status());
    // Sent from the file (sendfile), piece by piece as it arrives.
    absl::StatusOr<io::BulkServer::Ticket> ticket =
        read->wait ? bulk_->Offer(read->path, read->offset,
                                  read->offset + read->bytes, read->wait)
                   : bulk_->Offer(read->path, read->offset);
    if (!ticket.ok()) return ToGrpc(ticket.status());
    resp->set_tier(proto::TIER_MEMORY);
    resp->set_file_bytes(ticket->bytes);
    resp->set_ticket(ticket->token);
    resp->set_port(static_cast<uint32_t>(bulk_->port()));
    return grpc::Status::OK;
  }

  grpc::Status OfferShard(grpc::ServerContext* ctx,
                          const proto::FetchShardRequest* req,
                          proto::ShardOffer* resp) override {
    if (grpc::Status in = Admit(*ctx, ""); !in.ok()) return in;
    if (bulk_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "bulk transfers are off on this node (mutual TLS): "
                          "use FetchShard");
    }
    const ReplicaStore::Key key = KeyOf(req->shard());
    absl::StatusOr<ServedCopy> copy = Best(key);
    if (!copy.ok()) return ToGrpc(copy.status());
    absl::StatusOr<snapshot::SelfContained> view =
        snapshot::OpenSelfContained(fs_, copy->path);
    if (!view.ok()) return ToGrpc(view.status());
    // A file is sent as it lies (sendfile); an incremental shard's view is
    // read piece by piece.
    absl::StatusOr<io::BulkServer::Ticket> ticket =
        view->incremental ? bulk_->Offer(std::move(view->file), view->size)
                          : bulk_->Offer(copy->path);
    if (!ticket.ok()) return ToGrpc(ticket.status());
    if (view->size != ticket->bytes) {
      return ToGrpc(absl::AbortedError(
          absl::StrCat(copy->path, " changed while it was offered")));
    }
    if (req->with_manifest()) resp->set_manifest(view->manifest_bytes);
    resp->set_tier(copy->tier);
    resp->set_file_bytes(ticket->bytes);
    resp->set_ticket(ticket->token);
    resp->set_port(static_cast<uint32_t>(bulk_->port()));
    return grpc::Status::OK;
  }

 private:
  // Who may call. With mutual TLS, a node of the cluster that the caller's
  // certificate names, and `claimed` (the sender a call names, if any) must
  // be one of the certificate's names. Without TLS (loopback, or the
  // operator's --peer-insecure) no caller is authenticated.
  grpc::Status Admit(const grpc::ServerContext& ctx,
                     const std::string& claimed) {
    if (!tls_) return grpc::Status::OK;
    const std::vector<std::string> names = CertificateNames(ctx);
    const std::string listed =
        names.empty() ? "no name" : absl::StrJoin(names, ", ");
    bool member = false;
    for (const std::string& n : names)
      member = member || replicator_->directory()->IsMember(n);
    if (!member) {
      CKPT_LOG_WARN(
          "peer service: refused a call from {}: its certificate "
          "names {}, no node of this cluster",
          ctx.peer(), listed);
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("the peer's certificate names ", listed,
                       ": no node of this cluster (a node is known by the "
                       "peer address it publishes in the coordinator)"));
    }
    if (!claimed.empty() &&
        std::find(names.begin(), names.end(), claimed) == names.end()) {
      CKPT_LOG_WARN(
          "peer service: refused a call from {} claiming to be "
          "node {}: its certificate names {}",
          ctx.peer(), claimed, listed);
      return grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrCat("the call says it comes from node ", claimed,
                       ", but the peer's certificate names ", listed));
    }
    return grpc::Status::OK;
  }

  // The names the caller's certificate gives (none without TLS).
  std::vector<std::string> Callers(const grpc::ServerContext& ctx) const {
    return tls_ ? CertificateNames(ctx) : std::vector<std::string>();
  }

  // A call PeerAuthorization refused, logged with who made it.
  static grpc::Status Refused(const grpc::ServerContext& ctx,
                              const absl::Status& why) {
    CKPT_LOG_WARN("peer service: refused a call from {}: {}", ctx.peer(),
                  why.ToString());
    return ToGrpc(why);
  }

  // PullReplica makes this node connect to `host`: only to the host the call
  // comes from, so that no caller can point ckptd at an address of its
  // choosing. With TLS there are no bulk transfers at all.
  grpc::Status MayDial(const grpc::ServerContext& ctx,
                       const std::string& host) {
    if (tls_ || bulk_ == nullptr) {
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                          "bulk transfers are off on this node (mutual TLS): "
                          "push the replica with PushReplica");
    }
    const std::string caller = io::IpOfGrpcPeer(ctx.peer());
    absl::StatusOr<std::vector<std::string>> addresses = io::ResolveHost(host);
    if (!caller.empty() && addresses.ok() &&
        std::find(addresses->begin(), addresses->end(), caller) !=
            addresses->end()) {
      return grpc::Status::OK;
    }
    return grpc::Status(
        grpc::StatusCode::PERMISSION_DENIED,
        absl::StrCat("PullReplica names host \"", host,
                     "\", which is not the address the call comes from (",
                     ctx.peer(), "): this node fetches only from its caller"));
  }

  // Room for a replica; replicas of steps retention no longer keeps make
  // room when the store is full.
  absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> Receive(
      const ReplicaStore::Key& key, uint64_t bytes) {
    ReplicaStore* held = replicator_->held();
    absl::StatusOr<std::unique_ptr<ReplicaStore::Receiver>> receiver =
        held->Receive(key, bytes);
    if (absl::IsResourceExhausted(receiver.status())) {
      replicator_->CollectGarbage(key.job);
      receiver = held->Receive(key, bytes);
    }
    return receiver;
  }

  // Verifies a replica received whole and makes it count.
  grpc::Status Stored(const ReplicaStore::Key& key, const std::string& from,
                      std::unique_ptr<ReplicaStore::Receiver> receiver,
                      proto::PushReplicaResponse* resp) {
    absl::StatusOr<ReplicaStore::Entry> stored = receiver->Finish();
    if (!stored.ok()) {
      CKPT_LOG_WARN("replica of {} from node {} refused: {}", Describe(key),
                    from, stored.status().ToString());
      return ToGrpc(stored.status());
    }
    resp->set_bytes(stored->bytes);
    authorization_.Held(key, from, *replicator_->held());
    CKPT_LOG_INFO("holding a replica of {} for node {} ({} bytes{})",
                  Describe(key), from, stored->bytes,
                  stored->base_steps.empty()
                      ? ""
                      : absl::StrCat(", an increment over steps ",
                                     absl::StrJoin(stored->base_steps, ",")));
    replicator_->CollectGarbage(key.job);
    return grpc::Status::OK;
  }

  // The copy of a shard this node serves (server/served_copy.h).
  absl::StatusOr<ServedCopy> Best(const ReplicaStore::Key& key) {
    return BestServedCopy(fs_, *replicator_, *service_, key);
  }

  grpc::Status Send(grpc::ServerContext* ctx,
                    grpc::ServerWriter<proto::ShardPiece>* writer,
                    uint64_t size, const char* what, const PieceRead& read) {
    return SendPieces(ctx, writer, size, what, watchdog_, send_rate_, read);
  }

  // A version's file as a peer asked for it: held here, or arriving (a
  // version about to arrive is waited for as long as a stalled piece).
  absl::StatusOr<Publisher::PeerRead> OpenVersionFile(
      const proto::VersionFileRequest& req) {
    Publisher* publisher = service_->publisher();
    if (publisher == nullptr) return NoPublication();
    return publisher->OpenForPeer(req, version_stall_, version_stall_);
  }

  static absl::Status NoPublication() {
    return absl::FailedPreconditionError(
        "publication is off on this node (--publish-dir none)");
  }

  static grpc::Status NoParity() {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this node keeps no parity: start every node of the "
                        "cluster with the same --peer-redundancy rs:K+M");
  }

  CheckpointService* const service_;
  Replicator* const replicator_;
  io::BulkServer* const bulk_;  // null: bulk transfers off
  ParityStore* const parity_;   // null: no erasure-coded peer tier
  io::FileSystem* const fs_;    // where copies served are read
  const bool tls_;              // mutual TLS: callers are authenticated
  CallWatchdog* const watchdog_;
  io::RateLimiter* const send_rate_;  // null: sends uncapped
  const absl::Duration version_stall_;
  PeerAuthorization authorization_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PeerServer>> PeerServer::Start(
    CheckpointService* service, Replicator* replicator, ParityStore* parity,
    io::FileSystem* fs, const PeerServerOptions& options) {
  const size_t colon = options.address.rfind(':');
  int wanted_port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.address.substr(colon + 1), &wanted_port) ||
      wanted_port < 0 || wanted_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "peer address \"", options.address, "\" is not HOST:PORT"));
  }
  const int tls_files = !options.tls_ca_file.empty() +
                        !options.tls_cert_file.empty() +
                        !options.tls_key_file.empty();
  if (tls_files != 0 && tls_files != 3) {
    return absl::InvalidArgumentError(
        "peer TLS needs a CA, a certificate and a key file (all three)");
  }
  std::shared_ptr<grpc::ServerCredentials> creds =
      grpc::InsecureServerCredentials();
  if (tls_files == 3) {
    ASSIGN_OR_RETURN(
        creds, PeerServerCredentials(options.tls_ca_file, options.tls_cert_file,
                                     options.tls_key_file));
  }
  std::unique_ptr<PeerServer> server(new PeerServer());
  server->replicator_ = replicator;
  if (tls_files == 0) {
    // Plain TCP like the peer service itself; with TLS, bytes stay in it.
    io::BulkLimits limits;
    limits.send_rate = options.send_rate;
    ASSIGN_OR_RETURN(
        server->bulk_,
        io::BulkServer::Start(options.address.substr(0, colon), limits));
    replicator->SetBulkServer(server->bulk_);
  }
  server->watchdog_ = std::make_unique<CallWatchdog>(options.idle_timeout);
  server->service_ = std::make_unique<PeerService>(
      service, replicator, server->bulk_.get(), parity, fs, tls_files == 3,
      server->watchdog_.get(), options.send_rate, options.version_stall);
  grpc::ServerBuilder builder;
  // At most `max_calls` calls run at once (more are refused
  // RESOURCE_EXHAUSTED), and a connection opens at most 16 streams at once.
  grpc::ResourceQuota quota("ckptd-peer");
  quota.SetMaxThreads(options.max_calls);
  builder.SetResourceQuota(quota);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, 16);
  builder.AddListeningPort(options.address, creds, &server->port_);
  builder.RegisterService(server->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for peers on ", options.address,
                     " (in use, or not an address of this host?)"));
  }
  server->address_ =
      absl::StrCat(options.address.substr(0, colon), ":", server->port_);
  return server;
}

PeerServer::~PeerServer() {
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  if (bulk_ != nullptr) replicator_->SetBulkServer(nullptr);
  bulk_.reset();
}

}  // namespace ckpt::daemon
