// ParityTier: rebuilding a lost shard from k blocks of its parity group.
#include <grpcpp/grpcpp.h>

#include <functional>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "daemon/describe.h"
#include "daemon/grpc_status.h"
#include "daemon/parity_plan.h"
#include "daemon/parity_tier.h"
#include "io/bulk_transfer.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {
namespace {

// Reads a server stream of ShardPiece whose first piece says the size.
absl::StatusOr<std::string> ReadPieces(
    grpc::ClientReader<proto::ShardPiece>* reader, uint64_t expected,
    const std::string& what) {
  std::string bytes;
  bytes.reserve(expected);
  proto::ShardPiece piece;
  bool first = true;
  while (reader->Read(&piece)) {
    if (first && piece.file_bytes() != expected) {
      reader->Finish();
      return absl::DataLossError(absl::StrCat(what, " is ", piece.file_bytes(),
                                              " bytes, its plan says ",
                                              expected));
    }
    first = false;
    bytes.append(piece.data());
    if (bytes.size() > expected) {
      reader->Finish();
      return absl::DataLossError(
          absl::StrCat(what, ": more than ", expected, " bytes arrived"));
    }
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), what));
  if (bytes.size() != expected) {
    return absl::DataLossError(absl::StrCat(what, ": ", bytes.size(), " of ",
                                            expected, " bytes arrived"));
  }
  return bytes;
}

// A block from a peer: offered as a bulk transfer over plain TCP when the
// peer can (`offer`), else streamed over gRPC (`stream`).
absl::StatusOr<std::string> FromPeer(
    const std::string& address, uint64_t expected, const std::string& what,
    const std::function<grpc::Status(grpc::ClientContext*, proto::ShardOffer*)>&
        offer,
    const std::function<std::unique_ptr<grpc::ClientReader<proto::ShardPiece>>(
        grpc::ClientContext*)>& stream) {
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ShardOffer o;
    grpc::Status offered = offer(&context, &o);
    if (offered.ok()) {
      if (o.file_bytes() != expected) {
        return absl::DataLossError(absl::StrCat(
            what, " is ", o.file_bytes(), " bytes, its plan says ", expected));
      }
      std::string bytes(expected, '\0');
      RETURN_IF_ERROR(
          io::BulkFetch(address.substr(0, address.rfind(':')),
                        static_cast<int>(o.port()), o.ticket(),
                        absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()),
                                       bytes.size()),
                        absl::Seconds(30)));
      return bytes;
    }
    if (offered.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        offered.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      return FromGrpc(offered, what);
    }
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(30) +
      absl::Seconds(static_cast<double>(expected) / (20 << 20))));
  auto reader = stream(&context);
  return ReadPieces(reader.get(), expected, what);
}

}  // namespace

absl::StatusOr<std::string> ParityTier::DataBlock(
    const proto::ParityPlan& plan, const proto::ParityGroup& group, int index,
    const std::map<std::string, proto::PeerInfo>& live) {
  const proto::ShardHolder& holder = group.data(index);
  const std::string what =
      absl::StrCat("data block ", index, " (rank ", holder.rank(), " on node ",
                   holder.node(), ")");
  if (holder.node() == options_.node_id) {
    ASSIGN_OR_RETURN(absl::optional<std::string> path,
                     local_file_(plan.job(), plan.step(), holder.rank()));
    if (!path.has_value()) {
      return absl::NotFoundError(absl::StrCat(what, ": not here any more"));
    }
    ASSIGN_OR_RETURN(snapshot::SelfContained view,
                     snapshot::OpenSelfContained(fs_, *path));
    if (view.size != holder.file_bytes()) {
      return absl::DataLossError(
          absl::StrCat(what, " is another save (", view.size, " bytes)"));
    }
    std::string bytes(view.size, '\0');
    RETURN_IF_ERROR(view.file->Read(
        0, absl::MakeSpan(reinterpret_cast<uint8_t*>(bytes.data()),
                          bytes.size())));
    return bytes;
  }
  auto peer = live.find(holder.node());
  if (peer == live.end()) {
    return absl::UnavailableError(absl::StrCat(what, ": node not live"));
  }
  auto stub = proto::CkptPeer::NewStub(channel_to_(peer->second.address()));
  proto::FetchShardRequest req;
  req.mutable_shard()->set_job(plan.job());
  req.mutable_shard()->set_step(plan.step());
  req.mutable_shard()->set_rank(holder.rank());
  return FromPeer(
      peer->second.address(), holder.file_bytes(), what,
      [&](grpc::ClientContext* c, proto::ShardOffer* o) {
        return stub->OfferShard(c, req, o);
      },
      [&](grpc::ClientContext* c) { return stub->FetchShard(c, req); });
}

absl::StatusOr<std::string> ParityTier::ParityBlock(
    const proto::ParityPlan& plan, const proto::ParityGroup& group, int index,
    const std::string& node,
    const std::map<std::string, proto::PeerInfo>& live) {
  const std::string what =
      node == group.parity_nodes(index)
          ? absl::StrCat("parity block ", index, " (on node ", node, ")")
          : absl::StrCat("parity block ", index, " (on node ", node,
                         " for node ", group.parity_nodes(index), ")");
  if (node.empty()) {
    return absl::UnavailableError(absl::StrCat(
        "parity block ", index, " (on node ", group.parity_nodes(index),
        "): node not live, and no node holds it in its place"));
  }
  proto::ParityBlockKey key;
  key.set_job(plan.job());
  key.set_step(plan.step());
  key.set_group(group.group());
  key.set_index(index);
  if (node == options_.node_id) {
    ASSIGN_OR_RETURN(ParityStore::Complete block, store_->OpenComplete(key));
    return std::string(reinterpret_cast<const char*>(block.map->data()),
                       block.map->size());
  }
  auto peer = live.find(node);
  if (peer == live.end()) {
    return absl::UnavailableError(absl::StrCat(what, ": node not live"));
  }
  auto stub = proto::CkptPeer::NewStub(channel_to_(peer->second.address()));
  proto::ParityBlockRequest req;
  *req.mutable_block() = key;
  return FromPeer(
      peer->second.address(), group.stripe_bytes(), what,
      [&](grpc::ClientContext* c, proto::ShardOffer* o) {
        return stub->OfferParity(c, req, o);
      },
      [&](grpc::ClientContext* c) { return stub->FetchParity(c, req); });
}

absl::StatusOr<std::vector<std::pair<uint32_t, std::string>>>
ParityTier::Rebuild(const std::string& job, uint64_t step, uint32_t rank) {
  const std::string what = Describe(job, step, rank);
  ASSIGN_OR_RETURN(absl::optional<proto::ParityPlan> plan,
                   coordinator_->GetParityPlan(job, step));
  if (!plan.has_value()) {
    return absl::NotFoundError(
        absl::StrCat(what, ": its step has no parity plan"));
  }
  ASSIGN_OR_RETURN(ParityPosition at, FindInPlan(*plan, rank));
  const proto::ParityGroup& group = *at.group;
  ASSIGN_OR_RETURN(auto live, LivePeers());
  std::set<std::string> live_ids;
  for (const auto& [id, info] : live) live_ids.insert(id);
  const std::vector<std::string> holders = ParityHolders(group, live_ids);
  const absl::Time start = absl::Now();
  const int k = code_.k();
  const int n = k + code_.m();
  std::vector<absl::StatusOr<std::string>> blocks(
      n, absl::UnavailableError("not fetched"));
  std::vector<uint64_t> lengths(n, 0);
  for (int i = 0; i < group.data_size(); ++i) {
    lengths[i] = group.data(i).file_bytes();
  }
  // Positions the group leaves empty are zeros: had already.
  int have = k - group.data_size();
  for (int i = group.data_size(); i < k; ++i) blocks[i] = std::string();
  for (int j = 0; j < code_.m(); ++j) lengths[k + j] = group.stripe_bytes();
  // The other data blocks first, all at once; then as many parity blocks as
  // are still needed, at once, and more while some fail.
  std::vector<bool> tried(n, false);
  auto fetch = [&](const std::vector<int>& which) {
    std::vector<std::thread> threads;
    for (int b : which) {
      tried[b] = true;
      threads.emplace_back([&, b] {
        blocks[b] =
            b < k ? DataBlock(*plan, group, b, live)
                  : ParityBlock(*plan, group, b - k, holders[b - k], live);
      });
    }
    for (std::thread& t : threads) t.join();
    for (int b : which) have += blocks[b].ok() ? 1 : 0;
  };
  std::vector<int> data;
  for (int i = 0; i < group.data_size(); ++i) {
    if (i != at.index) data.push_back(i);
  }
  fetch(data);
  for (int next = k; have < k && next < n;) {
    std::vector<int> parity;
    for (; next < n && static_cast<int>(parity.size()) < k - have; ++next) {
      parity.push_back(next);
    }
    fetch(parity);
  }
  const std::string group_name =
      absl::StrCat(code_.ToString(), " group ", group.group(), " of job ", job,
                   " step ", step);
  if (have < k) {
    std::vector<std::string> failures;
    for (int b = 0; b < n; ++b) {
      if (tried[b] && !blocks[b].ok()) {
        failures.push_back(std::string(blocks[b].status().message()));
      }
    }
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": cannot rebuild it from ", group_name, ": ", have,
                     " of the ", k, " blocks needed could be had (",
                     absl::StrJoin(failures, "; "), ")"));
  }
  // Rebuilt: the one asked for, and the group's other data blocks that could
  // not be had (lost with the same nodes).
  std::vector<int> wanted = {at.index};
  for (int i : data) {
    if (!blocks[i].ok()) wanted.push_back(i);
  }
  std::vector<absl::Span<const uint8_t>> spans(n);
  std::vector<bool> present(n, false);
  for (int b = 0; b < n; ++b) {
    if (!blocks[b].ok()) continue;
    present[b] = true;
    spans[b] = absl::MakeConstSpan(
        reinterpret_cast<const uint8_t*>(blocks[b]->data()), blocks[b]->size());
  }
  ASSIGN_OR_RETURN(std::vector<std::vector<uint8_t>> rebuilt,
                   code_.Rebuild(spans, present, lengths, wanted));
  std::vector<std::pair<uint32_t, std::string>> out;
  uint64_t bytes = 0;
  for (size_t w = 0; w < wanted.size(); ++w) {
    bytes += rebuilt[w].size();
    out.emplace_back(group.data(wanted[w]).rank(),
                     std::string(rebuilt[w].begin(), rebuilt[w].end()));
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const Labels labels = {{"job", job}};
  metrics_->Add("ckpt_parity_rebuilt_bytes_total", labels,
                static_cast<double>(bytes));
  metrics_->Add("ckpt_parity_rebuild_seconds_total", labels, seconds);
  CKPT_LOG_INFO("{}: rebuilt {} bytes from {} in {:.1f} ms ({} shards of it)",
                what, out[0].second.size(), group_name, seconds * 1e3,
                out.size());
  return out;
}

}  // namespace ckpt::daemon
