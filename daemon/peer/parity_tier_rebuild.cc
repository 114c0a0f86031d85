// ParityTier: rebuilding a lost shard from k blocks of its parity group.
//
// The k blocks are fetched at once (bulk transfers, or gRPC streams under
// mutual TLS) and decoded as they arrive, segment after segment, straight
// into the buffers the caller keeps the rebuilt files in. A block that fails
// to arrive is replaced by another of the group and the decode starts over.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <functional>
#include <map>
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

// One rebuild of a shard, as named steps: where each block of the group can
// be had (Locate), what is rebuilt with it (ChooseOutputs), k blocks fetched
// and decoded as they arrive, failed blocks replaced until the decode
// succeeds or fewer than k can be had (Decode), and the figures (Report).
class ParityTier::Rebuilding {
 public:
  Rebuilding(ParityTier* tier, const std::string& job, uint64_t step,
             uint32_t rank, const RebuildSink& sink)
      : tier_(*tier),
        job_(job),
        step_(step),
        rank_(rank),
        sink_(sink),
        what_(Describe(job, step, rank)) {}
  ~Rebuilding() { StopFetching(); }

  absl::StatusOr<std::vector<uint32_t>> Run() {
    RETURN_IF_ERROR(Locate());
    RETURN_IF_ERROR(ChooseOutputs());
    RETURN_IF_ERROR(Decode());
    return Report();
  }

 private:
  // The plan, the group, and where each of its blocks can be had: this node
  // first, then the other data nodes, then the parity holders. Positions the
  // group leaves empty are zeros, present already.
  absl::Status Locate() {
    ASSIGN_OR_RETURN(plan_, tier_.coordinator_->GetParityPlan(job_, step_));
    if (!plan_.has_value()) {
      return absl::NotFoundError(
          absl::StrCat(what_, ": its step has no parity plan"));
    }
    ASSIGN_OR_RETURN(ParityPosition at, FindInPlan(*plan_, rank_));
    group_ = at.group;
    index_ = at.index;
    ASSIGN_OR_RETURN(live_, tier_.LivePeers());
    start_ = absl::Now();
    k_ = tier_.code_.k();
    n_ = k_ + tier_.code_.m();
    group_name_ =
        absl::StrCat(tier_.code_.ToString(), " group ", group_->group(),
                     " of job ", job_, " step ", step_);
    lengths_.assign(n_, group_->stripe_bytes());
    for (int i = 0; i < k_; ++i) {
      lengths_[i] = i < group_->data_size() ? group_->data(i).file_bytes() : 0;
    }
    sources_.resize(n_);
    present_.assign(n_, false);
    node_of_.resize(n_);
    for (int i = group_->data_size(); i < k_; ++i) present_[i] = true;
    std::set<std::string> live_ids;
    for (const auto& [id, info] : live_) live_ids.insert(id);
    const std::vector<std::string> holders = ParityHolders(*group_, live_ids);
    for (int b = 0; b < n_; ++b) {
      if (b < group_->data_size()) {
        if (b == index_) continue;
        node_of_[b] = group_->data(b).node();
      } else if (b >= k_ && b - k_ < static_cast<int>(holders.size())) {
        node_of_[b] = holders[b - k_];
      } else {
        continue;
      }
      LocateBlock(b);
    }
    std::stable_sort(candidates_.begin(), candidates_.end(),
                     [&](int a, int b) { return IsHere(a) > IsHere(b); });
    return absl::OkStatus();
  }

  // Block `b`, expected on node_of_[b]: a candidate, or a failure (a data
  // block of a node that is gone and left no copy is lost too).
  void LocateBlock(int b) {
    if (b < group_->data_size() && live_.count(node_of_[b]) == 0) {
      // Its node is gone: a copy in its place (a stand-in's) reads as well.
      absl::optional<std::string> copy =
          tier_.CopyHolder(*plan_, group_->data(b), live_);
      if (copy.has_value()) {
        node_of_[b] = *copy;
        candidates_.push_back(b);
        return;
      }
    }
    if (node_of_[b].empty() || live_.count(node_of_[b]) == 0) {
      failures_.push_back(absl::StrCat(
          tier_.BlockName(*group_, b, node_of_[b]),
          node_of_[b].empty() ? ": no live node holds it" : ": node not live"));
      if (b < k_) lost_.push_back(b);
      return;
    }
    candidates_.push_back(b);
  }

  bool IsHere(int b) const { return node_of_[b] == tier_.options_.node_id; }

  // Rebuilt: the one asked for, and the group's other data blocks whose
  // nodes are gone with it, each into the buffer the sink gives.
  absl::Status ChooseOutputs() {
    RETURN_IF_ERROR(Want(index_));
    for (int b : lost_) RETURN_IF_ERROR(Want(b));
    return absl::OkStatus();
  }

  // Adds data block `b` to what is rebuilt, if the sink has room for it.
  absl::Status Want(int b) {
    const proto::ShardHolder& holder = group_->data(b);
    absl::StatusOr<RebuildWriter> buffer =
        sink_(holder.rank(), holder.file_bytes());
    if (!buffer.ok() && b == index_) return buffer.status();
    if (!buffer.ok()) {
      CKPT_LOG_WARN("{}: rank {} is not rebuilt with it: {}", what_,
                    holder.rank(), buffer.status().ToString());
      return absl::OkStatus();
    }
    wanted_.push_back(b);
    out_.push_back(*buffer);
    ranks_.push_back(holder.rank());
    return absl::OkStatus();
  }

  absl::Status Decode() {
    for (;;) {
      RETURN_IF_ERROR(SelectBlocks());
      const std::vector<int> reading = StartFetching();
      Writers writers(out_);
      absl::Status decoded = tier_.code_.RebuildStreamed(
          present_, lengths_, wanted_, /*threads=*/2, *arrivals_, writers);
      StopFetching();
      if (decoded.ok()) return absl::OkStatus();
      if (!absl::IsUnavailable(decoded)) return decoded;
      ASSIGN_OR_RETURN(const bool replaced, DropFailed(reading));
      if (!replaced) return decoded;
    }
  }

  // Makes room for k blocks; more in place of failed ones.
  absl::Status SelectBlocks() {
    int have =
        static_cast<int>(std::count(present_.begin(), present_.end(), true));
    for (; have < k_ && next_ < candidates_.size(); ++next_) {
      const int b = candidates_[next_];
      absl::Status prepared =
          tier_.PrepareBlock(*plan_, *group_, b, node_of_[b], &sources_[b]);
      if (!prepared.ok()) {
        failures_.push_back(std::string(prepared.message()));
        continue;
      }
      present_[b] = true;
      ++have;
    }
    if (have >= k_) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(what_, ": cannot rebuild it from ", group_name_, ": ",
                     have, " of the ", k_, " blocks needed could be had (",
                     absl::StrJoin(failures_, "; "), ")"));
  }

  // One thread per block not mapped here, each filling it from its start.
  // Returns the blocks being fetched.
  std::vector<int> StartFetching() {
    arrivals_ = std::make_unique<Arrivals>(&sources_);
    std::vector<int> reading;
    for (int b = 0; b < n_; ++b) {
      if (!present_[b] || sources_[b].ring == nullptr) continue;
      reading.push_back(b);
      Source* source = &sources_[b];
      source->arrived = 0;
      source->done = false;
      source->status = absl::OkStatus();
      const std::string address = live_.at(node_of_[b]).address();
      fetching_.emplace_back(
          [this, b, source, address, feed = arrivals_.get()] {
            feed->Done(source, tier_.FillBlock(*plan_, *group_, b, node_of_[b],
                                               address, source, feed));
          });
    }
    return reading;
  }

  void StopFetching() {
    if (arrivals_ != nullptr) arrivals_->Cancel();
    for (std::thread& t : fetching_) t.join();
    fetching_.clear();
  }

  // Some block failed to arrive: its place goes to another. False when none
  // of `reading` failed.
  absl::StatusOr<bool> DropFailed(const std::vector<int>& reading) {
    bool replaced = false;
    for (int b : reading) {
      const absl::Status& status = sources_[b].status;
      if (status.ok() || absl::IsCancelled(status)) continue;
      failures_.push_back(std::string(status.message()));
      CKPT_LOG_WARN("{}: {}", what_, status.ToString());
      present_[b] = false;
      sources_[b] = Source();
      replaced = true;
      // A data block that cannot be had is likely lost too.
      if (b < group_->data_size()) RETURN_IF_ERROR(Want(b));
    }
    return replaced;
  }

  std::vector<uint32_t> Report() {
    uint64_t bytes = 0;
    for (int b : wanted_) bytes += lengths_[b];
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start_);
    const Labels labels = {{"job", job_}};
    tier_.metrics_->Add("ckpt_parity_rebuilt_bytes_total", labels,
                        static_cast<double>(bytes));
    tier_.metrics_->Add("ckpt_parity_rebuild_seconds_total", labels, seconds);
    CKPT_LOG_INFO(
        "{}: rebuilt {} bytes from {} in {:.1f} ms, {:.0f} MiB/s ({} shards "
        "of it)",
        what_, lengths_[wanted_[0]], group_name_, seconds * 1e3,
        seconds > 0 ? bytes / seconds / (1 << 20) : 0.0, ranks_.size());
    return ranks_;
  }

  ParityTier& tier_;
  const std::string job_;
  const uint64_t step_;
  const uint32_t rank_;
  const RebuildSink& sink_;
  const std::string what_;

  // Located.
  absl::optional<proto::ParityPlan> plan_;
  const proto::ParityGroup* group_ = nullptr;
  int index_ = 0;  // of the rank asked for, in the group
  std::map<std::string, proto::PeerInfo> live_;
  absl::Time start_;
  int k_ = 0;
  int n_ = 0;
  std::string group_name_;
  std::vector<uint64_t> lengths_;
  std::vector<std::string> node_of_;
  std::vector<int> candidates_;  // blocks to try, in order
  size_t next_ = 0;              // the next candidate to try
  std::vector<int> lost_;        // data blocks no live node holds
  std::vector<std::string> failures_;

  // Chosen.
  std::vector<int> wanted_;
  std::vector<RebuildWriter> out_;
  std::vector<uint32_t> ranks_;

  // Decoding.
  std::vector<Source> sources_;
  std::vector<bool> present_;
  std::unique_ptr<Arrivals> arrivals_;
  std::vector<std::thread> fetching_;
};

absl::StatusOr<std::vector<uint32_t>> ParityTier::Rebuild(
    const std::string& job, uint64_t step, uint32_t rank,
    const RebuildSink& sink) {
  return Rebuilding(this, job, step, rank, sink).Run();
}

}  // namespace ckpt::daemon
