// ParityTier: rebuilding a lost shard from k blocks of its parity group.
//
// The k blocks are fetched at once (bulk transfers, or gRPC streams under
// mutual TLS) and decoded as they arrive, segment after segment, straight
// into the buffers the caller keeps the rebuilt files in. A block that fails
// to arrive is replaced by another of the group and the decode starts over.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <set>
#include <thread>

#include "absl/cleanup/cleanup.h"
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

// One block of the group as a rebuild reads it: its bytes (owned, or a
// mapping of a parity block held here) and how many have arrived.
struct ParityTier::Source {
  std::unique_ptr<uint8_t[]> owned;
  std::unique_ptr<io::MappedFile> map;
  absl::Span<const uint8_t> bytes;
  uint64_t arrived = 0;  // guarded by Arrivals::mu
  bool done = false;     // guarded by Arrivals::mu
  absl::Status status;   // once done
};

// What the fetching threads tell the decoding ones.
struct ParityTier::Arrivals {
  absl::Mutex mu;
  absl::CondVar changed;
  void Arrived(Source* s, uint64_t bytes) {
    absl::MutexLock lock(&mu);
    s->arrived = bytes;
    changed.SignalAll();
  }
  void Done(Source* s, absl::Status status) {
    absl::MutexLock lock(&mu);
    if (status.ok()) s->arrived = s->bytes.size();  // checked by the fetch
    s->status = std::move(status);
    s->done = true;
    changed.SignalAll();
  }
};

namespace {

constexpr uint64_t kPiece = 4 << 20;

// Reads a server stream of ShardPiece whose first piece says the size into
// `dst`, telling `arrived` after every piece.
absl::Status ReadPieces(grpc::ClientReader<proto::ShardPiece>* reader,
                        absl::Span<uint8_t> dst, const std::string& what,
                        const std::function<void(uint64_t)>& arrived) {
  uint64_t got = 0;
  proto::ShardPiece piece;
  bool first = true;
  while (reader->Read(&piece)) {
    if (first && piece.file_bytes() != dst.size()) {
      reader->Finish();
      return absl::DataLossError(absl::StrCat(what, " is ", piece.file_bytes(),
                                              " bytes, its plan says ",
                                              dst.size()));
    }
    first = false;
    if (piece.data().size() > dst.size() - got) {
      reader->Finish();
      return absl::DataLossError(
          absl::StrCat(what, ": more than ", dst.size(), " bytes arrived"));
    }
    std::memcpy(dst.data() + got, piece.data().data(), piece.data().size());
    got += piece.data().size();
    arrived(got);
  }
  RETURN_IF_ERROR(FromGrpc(reader->Finish(), what));
  if (got != dst.size()) {
    return absl::DataLossError(
        absl::StrCat(what, ": ", got, " of ", dst.size(), " bytes arrived"));
  }
  return absl::OkStatus();
}

// A block from a peer into `dst`: offered as a bulk transfer over plain TCP
// when the peer can (`offer`), else streamed over gRPC (`stream`).
absl::Status FromPeer(
    const std::string& address, absl::Span<uint8_t> dst,
    const std::string& what,
    const std::function<grpc::Status(grpc::ClientContext*, proto::ShardOffer*)>&
        offer,
    const std::function<std::unique_ptr<grpc::ClientReader<proto::ShardPiece>>(
        grpc::ClientContext*)>& stream,
    const std::function<void(uint64_t)>& arrived) {
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    proto::ShardOffer o;
    grpc::Status offered = offer(&context, &o);
    if (offered.ok()) {
      if (o.file_bytes() != dst.size()) {
        return absl::DataLossError(absl::StrCat(what, " is ", o.file_bytes(),
                                                " bytes, its plan says ",
                                                dst.size()));
      }
      absl::Status got = io::BulkFetch(address.substr(0, address.rfind(':')),
                                       static_cast<int>(o.port()), o.ticket(),
                                       dst, absl::Seconds(30), arrived);
      if (!got.ok()) {
        return absl::Status(got.code(),
                            absl::StrCat(what, ": ", got.message()));
      }
      return absl::OkStatus();
    }
    if (offered.error_code() != grpc::StatusCode::FAILED_PRECONDITION &&
        offered.error_code() != grpc::StatusCode::UNIMPLEMENTED) {
      return FromGrpc(offered, what);
    }
  }
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(
      absl::Now() + absl::Seconds(30) +
      absl::Seconds(static_cast<double>(dst.size()) / (20 << 20))));
  auto reader = stream(&context);
  return ReadPieces(reader.get(), dst, what, arrived);
}

// An uninitialized buffer (every byte is written by the fetch).
std::unique_ptr<uint8_t[]> Buffer(uint64_t bytes) {
  return std::unique_ptr<uint8_t[]>(new uint8_t[std::max<uint64_t>(bytes, 1)]);
}

}  // namespace

std::string ParityTier::BlockName(const proto::ParityGroup& group, int b,
                                  const std::string& node) const {
  const int k = code_.k();
  if (b < k) {
    const proto::ShardHolder& holder = group.data(b);
    if (!node.empty() && node != holder.node()) {
      return absl::StrCat("data block ", b, " (rank ", holder.rank(),
                          ", a copy on node ", node, " for node ",
                          holder.node(), ")");
    }
    return absl::StrCat("data block ", b, " (rank ", holder.rank(), " on node ",
                        holder.node(), ")");
  }
  const int j = b - k;
  if (node.empty()) {
    return absl::StrCat("parity block ", j, " (on node ", group.parity_nodes(j),
                        ")");
  }
  return node == group.parity_nodes(j)
             ? absl::StrCat("parity block ", j, " (on node ", node, ")")
             : absl::StrCat("parity block ", j, " (on node ", node,
                            " for node ", group.parity_nodes(j), ")");
}

absl::Status ParityTier::PrepareBlock(const proto::ParityPlan& plan,
                                      const proto::ParityGroup& group, int b,
                                      const std::string& node, Source* source) {
  if (b < code_.k()) {
    const uint64_t bytes = group.data(b).file_bytes();
    source->owned = Buffer(bytes);
    source->bytes = absl::MakeConstSpan(source->owned.get(), bytes);
    return absl::OkStatus();
  }
  if (node == options_.node_id) {
    ASSIGN_OR_RETURN(ParityStore::Complete block,
                     store_->OpenComplete(BlockKey(plan.job(), plan.step(),
                                                   group, b - code_.k())));
    if (block.map->size() != group.stripe_bytes()) {
      return absl::DataLossError(
          absl::StrCat(BlockName(group, b, node), " is ", block.map->size(),
                       " bytes, its plan says ", group.stripe_bytes()));
    }
    source->map = std::move(block.map);
    source->bytes =
        absl::MakeConstSpan(source->map->data(), source->map->size());
    source->arrived = source->bytes.size();
    return absl::OkStatus();
  }
  source->owned = Buffer(group.stripe_bytes());
  source->bytes =
      absl::MakeConstSpan(source->owned.get(), group.stripe_bytes());
  return absl::OkStatus();
}

absl::Status ParityTier::FillBlock(const proto::ParityPlan& plan,
                                   const proto::ParityGroup& group, int b,
                                   const std::string& node,
                                   const std::string& address, Source* source,
                                   Arrivals* arrivals) {
  const std::string what = BlockName(group, b, node);
  auto arrived = [&](uint64_t n) { arrivals->Arrived(source, n); };
  const absl::Span<uint8_t> dst(source->owned.get(), source->bytes.size());
  if (b >= code_.k()) {
    auto stub = proto::CkptPeer::NewStub(channel_to_(address));
    proto::ParityBlockRequest req;
    *req.mutable_block() =
        BlockKey(plan.job(), plan.step(), group, b - code_.k());
    return FromPeer(
        address, dst, what,
        [&](grpc::ClientContext* c, proto::ShardOffer* o) {
          return stub->OfferParity(c, req, o);
        },
        [&](grpc::ClientContext* c) { return stub->FetchParity(c, req); },
        arrived);
  }
  const proto::ShardHolder& holder = group.data(b);
  if (node == options_.node_id) {
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
    for (uint64_t off = 0; off < dst.size(); off += kPiece) {
      const uint64_t n = std::min<uint64_t>(kPiece, dst.size() - off);
      RETURN_IF_ERROR(view.file->Read(off, dst.subspan(off, n)));
      arrived(off + n);
    }
    return absl::OkStatus();
  }
  auto stub = proto::CkptPeer::NewStub(channel_to_(address));
  proto::FetchShardRequest req;
  req.mutable_shard()->set_job(plan.job());
  req.mutable_shard()->set_step(plan.step());
  req.mutable_shard()->set_rank(holder.rank());
  return FromPeer(
      address, dst, what,
      [&](grpc::ClientContext* c, proto::ShardOffer* o) {
        return stub->OfferShard(c, req, o);
      },
      [&](grpc::ClientContext* c) { return stub->FetchShard(c, req); },
      arrived);
}

absl::StatusOr<std::vector<uint32_t>> ParityTier::Rebuild(
    const std::string& job, uint64_t step, uint32_t rank,
    const RebuildSink& sink) {
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
  const std::string group_name =
      absl::StrCat(code_.ToString(), " group ", group.group(), " of job ", job,
                   " step ", step);
  std::vector<uint64_t> lengths(n, group.stripe_bytes());
  for (int i = 0; i < k; ++i) {
    lengths[i] = i < group.data_size() ? group.data(i).file_bytes() : 0;
  }
  // Where each block can be had: this node first, then the other data
  // nodes, then the parity holders. Positions the group leaves empty are
  // zeros, present already.
  std::vector<Source> sources(n);
  std::vector<bool> present(n, false);
  std::vector<std::string> node_of(n), failures;
  std::vector<int> candidates, lost;
  for (int i = group.data_size(); i < k; ++i) present[i] = true;
  for (int b = 0; b < n; ++b) {
    if (b < group.data_size()) {
      if (b == at.index) continue;
      node_of[b] = group.data(b).node();
    } else if (b >= k && b - k < static_cast<int>(holders.size())) {
      node_of[b] = holders[b - k];
    } else {
      continue;
    }
    if (b < group.data_size() && live.count(node_of[b]) == 0) {
      // Its node is gone: a copy in its place (a stand-in's) reads as well.
      absl::optional<std::string> copy = CopyHolder(*plan, group.data(b), live);
      if (copy.has_value()) {
        node_of[b] = *copy;
        candidates.push_back(b);
        continue;
      }
    }
    if (node_of[b].empty() || live.count(node_of[b]) == 0) {
      failures.push_back(absl::StrCat(
          BlockName(group, b, node_of[b]),
          node_of[b].empty() ? ": no live node holds it" : ": node not live"));
      if (b < k) lost.push_back(b);
      continue;
    }
    candidates.push_back(b);
  }
  std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
    return (node_of[a] == options_.node_id) > (node_of[b] == options_.node_id);
  });
  // Rebuilt: the one asked for, and the group's other data blocks whose
  // nodes are gone with it, each into the buffer the sink gives.
  std::vector<int> wanted;
  std::vector<absl::Span<uint8_t>> out;
  std::vector<uint32_t> ranks;
  // Adds data block `b` to what is rebuilt, if the sink has room for it.
  auto want = [&](int b) -> absl::Status {
    const proto::ShardHolder& holder = group.data(b);
    absl::StatusOr<absl::Span<uint8_t>> buffer =
        sink(holder.rank(), holder.file_bytes());
    if (!buffer.ok() && b == at.index) return buffer.status();
    if (!buffer.ok()) {
      CKPT_LOG_WARN("{}: rank {} is not rebuilt with it: {}", what,
                    holder.rank(), buffer.status().ToString());
      return absl::OkStatus();
    }
    wanted.push_back(b);
    out.push_back(*buffer);
    ranks.push_back(holder.rank());
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(want(at.index));
  for (int b : lost) RETURN_IF_ERROR(want(b));
  Arrivals arrivals;
  std::vector<std::thread> fetching;
  absl::Cleanup join = [&] {
    for (std::thread& t : fetching) t.join();
  };
  std::vector<absl::Span<const uint8_t>> spans(n);
  size_t next = 0;
  for (;;) {
    // k blocks that arrived or are arriving; more in place of failed ones.
    int have =
        static_cast<int>(std::count(present.begin(), present.end(), true));
    for (; have < k && next < candidates.size(); ++next) {
      const int b = candidates[next];
      absl::Status prepared =
          PrepareBlock(*plan, group, b, node_of[b], &sources[b]);
      if (!prepared.ok()) {
        failures.push_back(std::string(prepared.message()));
        continue;
      }
      present[b] = true;
      spans[b] = sources[b].bytes;
      ++have;
      if (sources[b].map != nullptr) continue;  // here already
      const std::string address = live.at(node_of[b]).address();
      fetching.emplace_back([&, b, address] {
        arrivals.Done(&sources[b], FillBlock(*plan, group, b, node_of[b],
                                             address, &sources[b], &arrivals));
      });
    }
    if (have < k) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": cannot rebuild it from ", group_name, ": ",
                       have, " of the ", k, " blocks needed could be had (",
                       absl::StrJoin(failures, "; "), ")"));
    }
    // Decoded as the blocks arrive: a segment once every source has it.
    std::vector<int> reading;
    for (int b = 0; b < n; ++b) {
      if (present[b]) reading.push_back(b);
    }
    auto ready = [&](uint64_t end) -> absl::Status {
      absl::MutexLock lock(&arrivals.mu);
      for (int b : reading) {
        const Source& s = sources[b];
        const uint64_t need = std::min<uint64_t>(end, s.bytes.size());
        while (s.arrived < need && !s.done) arrivals.changed.Wait(&arrivals.mu);
        if (s.done && !s.status.ok()) {
          return absl::UnavailableError(BlockName(group, b, node_of[b]));
        }
      }
      return absl::OkStatus();
    };
    absl::Status decoded =
        code_.RebuildInto(spans, present, lengths, wanted, out,
                          /*threads=*/2, ready);
    if (decoded.ok()) break;
    if (!absl::IsUnavailable(decoded)) return decoded;
    // Some block failed to arrive: its place goes to another.
    for (std::thread& t : fetching) t.join();
    fetching.clear();
    for (int b : reading) {
      if (sources[b].done && !sources[b].status.ok()) {
        failures.push_back(std::string(sources[b].status.message()));
        CKPT_LOG_WARN("{}: {}", what, sources[b].status.ToString());
        present[b] = false;
        spans[b] = {};
        // A data block that cannot be had is likely lost too.
        if (b < group.data_size()) RETURN_IF_ERROR(want(b));
      }
    }
  }
  std::move(join).Invoke();
  uint64_t bytes = 0;
  for (const auto& o : out) bytes += o.size();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const Labels labels = {{"job", job}};
  metrics_->Add("ckpt_parity_rebuilt_bytes_total", labels,
                static_cast<double>(bytes));
  metrics_->Add("ckpt_parity_rebuild_seconds_total", labels, seconds);
  CKPT_LOG_INFO(
      "{}: rebuilt {} bytes from {} in {:.1f} ms, {:.0f} MiB/s ({} shards "
      "of it)",
      what, out[0].size(), group_name, seconds * 1e3,
      seconds > 0 ? bytes / seconds / (1 << 20) : 0.0, ranks.size());
  return ranks;
}

}  // namespace ckpt::daemon
