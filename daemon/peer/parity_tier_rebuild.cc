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
#include "daemon/common/describe.h"
#include "daemon/peer/parity_plan.h"
#include "daemon/peer/parity_tier.h"
#include "daemon/peer/peer_fetch.h"
#include "io/logging.h"
#include "io/status_macros.h"
#include "proto/peer.grpc.pb.h"
#include "snapshot/self_contained.h"

namespace ckpt::daemon {

// One block of the group as a rebuild reads it: mapped whole (a parity block
// held here), or received into a ring of segments that the decode frees as it
// goes, so a rebuild holds a few MiB per block, not whole blocks, and the
// bytes are decoded while still in the cache.
struct ParityTier::Source {
  static constexpr uint64_t kRingSegments = 8;
  std::string name;  // BlockName
  uint64_t size = 0;
  std::unique_ptr<io::MappedFile> map;
  std::unique_ptr<uint8_t[]> ring;
  uint64_t arrived = 0;  // guarded by Arrivals::mu
  bool done = false;     // guarded by Arrivals::mu
  absl::Status status;   // once done

  uint8_t* Slot(uint64_t seg) const {
    return ring.get() + (seg % kRingSegments) * snapshot::ErasureCode::kSegment;
  }
};

// Between the fetching threads, which receive into the rings, and the
// decoding ones, which read and free them.
struct ParityTier::Arrivals : snapshot::ErasureCode::SegmentFeed {
  static constexpr uint64_t kSegment = snapshot::ErasureCode::kSegment;
  explicit Arrivals(std::vector<Source>* s) : sources(s) {}

  std::vector<Source>* const sources;
  absl::Mutex mu;
  absl::CondVar changed;
  uint64_t decoded ABSL_GUARDED_BY(mu) = 0;  // segments below it are done
  std::set<uint64_t> decoded_above ABSL_GUARDED_BY(mu);
  bool cancelled ABSL_GUARDED_BY(mu) = false;

  // Where the next bytes of `s` go: the rest of the segment its next byte is
  // in, once the ring has room for it (the decode freed the segment that
  // slot held).
  absl::StatusOr<absl::Span<uint8_t>> Space(Source* s) {
    absl::MutexLock lock(&mu);
    const uint64_t seg = s->arrived / kSegment;
    while (!cancelled && seg >= decoded + Source::kRingSegments) {
      changed.Wait(&mu);
    }
    if (cancelled) return absl::CancelledError("the rebuild stopped");
    const uint64_t at = s->arrived % kSegment;
    return absl::MakeSpan(
        s->Slot(seg) + at,
        std::min<uint64_t>(kSegment - at, s->size - s->arrived));
  }
  void Arrived(Source* s, uint64_t bytes) {
    absl::MutexLock lock(&mu);
    s->arrived += bytes;
    changed.SignalAll();
  }
  void Done(Source* s, absl::Status status) {
    absl::MutexLock lock(&mu);
    if (status.ok() && s->arrived != s->size) {
      status = absl::DataLossError(absl::StrCat(
          s->name, ": ", s->arrived, " of ", s->size, " bytes arrived"));
    }
    s->status = std::move(status);
    s->done = true;
    changed.SignalAll();
  }
  void Cancel() {
    absl::MutexLock lock(&mu);
    cancelled = true;
    changed.SignalAll();
  }

  absl::StatusOr<absl::Span<const uint8_t>> Acquire(int b,
                                                    uint64_t seg) override {
    Source& s = (*sources)[b];
    const uint64_t off = seg * kSegment;
    if (off >= s.size) return absl::Span<const uint8_t>();
    const uint64_t n = std::min<uint64_t>(kSegment, s.size - off);
    if (s.map != nullptr) return absl::MakeConstSpan(s.map->data() + off, n);
    absl::MutexLock lock(&mu);
    while (s.arrived < off + n && !s.done) changed.Wait(&mu);
    if (s.arrived < off + n) return absl::UnavailableError(s.name);
    return absl::MakeConstSpan(s.Slot(seg), n);
  }
  void Release(uint64_t seg) override {
    absl::MutexLock lock(&mu);
    decoded_above.insert(seg);
    while (!decoded_above.empty() && *decoded_above.begin() == decoded) {
      decoded_above.erase(decoded_above.begin());
      ++decoded;
    }
    changed.SignalAll();
  }
};

namespace {

// The rebuilt files' writers, as the decode hands segments over.
class Writers : public snapshot::ErasureCode::SegmentSink {
 public:
  explicit Writers(const std::vector<ParityTier::RebuildWriter>& out)
      : out_(out) {}
  absl::Status Put(size_t w, uint64_t off,
                   absl::Span<const uint8_t> bytes) override {
    return out_[w](off, bytes);
  }

 private:
  const std::vector<ParityTier::RebuildWriter>& out_;
};

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
  source->name = BlockName(group, b, node);
  source->size =
      b < code_.k() ? group.data(b).file_bytes() : group.stripe_bytes();
  if (b >= code_.k() && node == options_.node_id) {
    ASSIGN_OR_RETURN(ParityStore::Complete block,
                     store_->OpenComplete(BlockKey(plan.job(), plan.step(),
                                                   group, b - code_.k())));
    if (block.map->size() != group.stripe_bytes()) {
      return absl::DataLossError(
          absl::StrCat(source->name, " is ", block.map->size(),
                       " bytes, its plan says ", group.stripe_bytes()));
    }
    source->map = std::move(block.map);
    return absl::OkStatus();
  }
  // Uninitialized: every byte is received before it is read.
  source->ring.reset(
      new uint8_t[Source::kRingSegments * snapshot::ErasureCode::kSegment]);
  return absl::OkStatus();
}

absl::Status ParityTier::FillBlock(const proto::ParityPlan& plan,
                                   const proto::ParityGroup& group, int b,
                                   const std::string& node,
                                   const std::string& address, Source* source,
                                   Arrivals* arrivals) {
  const std::string& what = source->name;
  const FetchSink into{[&] { return arrivals->Space(source); },
                       [&](uint64_t n) { arrivals->Arrived(source, n); }};
  auto open = [&](uint64_t) -> absl::StatusOr<FetchSink> { return into; };
  if (b >= code_.k()) {
    auto stub = proto::CkptPeer::NewStub(channel_to_(address));
    proto::ParityBlockRequest req;
    *req.mutable_block() =
        BlockKey(plan.job(), plan.step(), group, b - code_.k());
    const PeerFileCalls calls{
        [&](grpc::ClientContext* c, proto::ShardOffer* o) {
          return stub->OfferParity(c, req, o);
        },
        [&](grpc::ClientContext* c) { return stub->FetchParity(c, req); }};
    return FetchFromPeer(address, source->size, what, calls, open);
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
    for (uint64_t off = 0; off < source->size;) {
      ASSIGN_OR_RETURN(absl::Span<uint8_t> dst, into.space());
      RETURN_IF_ERROR(view.file->Read(off, dst));
      off += dst.size();
      into.arrived(dst.size());
    }
    return absl::OkStatus();
  }
  auto stub = proto::CkptPeer::NewStub(channel_to_(address));
  proto::FetchShardRequest req;
  req.mutable_shard()->set_job(plan.job());
  req.mutable_shard()->set_step(plan.step());
  req.mutable_shard()->set_rank(holder.rank());
  const PeerFileCalls calls{
      [&](grpc::ClientContext* c, proto::ShardOffer* o) {
        return stub->OfferShard(c, req, o);
      },
      [&](grpc::ClientContext* c) { return stub->FetchShard(c, req); }};
  return FetchFromPeer(address, source->size, what, calls, open);
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
  std::vector<RebuildWriter> out;
  std::vector<uint32_t> ranks;
  // Adds data block `b` to what is rebuilt, if the sink has room for it.
  auto want = [&](int b) -> absl::Status {
    const proto::ShardHolder& holder = group.data(b);
    absl::StatusOr<RebuildWriter> buffer =
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
  std::unique_ptr<Arrivals> arrivals;
  std::vector<std::thread> fetching;
  auto stop_fetching = [&] {
    if (arrivals != nullptr) arrivals->Cancel();
    for (std::thread& t : fetching) t.join();
    fetching.clear();
  };
  absl::Cleanup join = stop_fetching;
  size_t next = 0;
  for (;;) {
    // k blocks; more in place of failed ones.
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
      ++have;
    }
    if (have < k) {
      return absl::FailedPreconditionError(
          absl::StrCat(what, ": cannot rebuild it from ", group_name, ": ",
                       have, " of the ", k, " blocks needed could be had (",
                       absl::StrJoin(failures, "; "), ")"));
    }
    // Decoded as the blocks stream in, each from its start.
    arrivals = std::make_unique<Arrivals>(&sources);
    std::vector<int> reading;
    for (int b = 0; b < n; ++b) {
      if (!present[b] || sources[b].ring == nullptr) continue;
      reading.push_back(b);
      Source* source = &sources[b];
      source->arrived = 0;
      source->done = false;
      source->status = absl::OkStatus();
      const std::string address = live.at(node_of[b]).address();
      fetching.emplace_back([&, b, source, address, feed = arrivals.get()] {
        feed->Done(source, FillBlock(*plan, group, b, node_of[b], address,
                                     source, feed));
      });
    }
    Writers writers(out);
    absl::Status decoded = code_.RebuildStreamed(
        present, lengths, wanted, /*threads=*/2, *arrivals, writers);
    stop_fetching();
    if (decoded.ok()) break;
    if (!absl::IsUnavailable(decoded)) return decoded;
    // Some block failed to arrive: its place goes to another.
    bool replaced = false;
    for (int b : reading) {
      const absl::Status& status = sources[b].status;
      if (status.ok() || absl::IsCancelled(status)) continue;
      failures.push_back(std::string(status.message()));
      CKPT_LOG_WARN("{}: {}", what, status.ToString());
      present[b] = false;
      sources[b] = Source();
      replaced = true;
      // A data block that cannot be had is likely lost too.
      if (b < group.data_size()) RETURN_IF_ERROR(want(b));
    }
    if (!replaced) return decoded;
  }
  std::move(join).Invoke();
  uint64_t bytes = 0;
  for (int b : wanted) bytes += lengths[b];
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const Labels labels = {{"job", job}};
  metrics_->Add("ckpt_parity_rebuilt_bytes_total", labels,
                static_cast<double>(bytes));
  metrics_->Add("ckpt_parity_rebuild_seconds_total", labels, seconds);
  CKPT_LOG_INFO(
      "{}: rebuilt {} bytes from {} in {:.1f} ms, {:.0f} MiB/s ({} shards "
      "of it)",
      what, lengths[wanted[0]], group_name, seconds * 1e3,
      seconds > 0 ? bytes / seconds / (1 << 20) : 0.0, ranks.size());
  return ranks;
}

}  // namespace ckpt::daemon
