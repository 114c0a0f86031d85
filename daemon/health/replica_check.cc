#include "daemon/health/replica_check.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "snapshot/xxh3.h"

namespace ckpt::daemon {
namespace {

// What makes two ranks' boxes replicas of each other: the item, its place in
// the global tensor and the chunks its checksums are of.
uint64_t BoxKey(const proto::Item& item, uint32_t chunk_size) {
  std::string key = item.name();
  key.push_back('\0');
  auto add = [&key](int64_t v) {
    key.append(reinterpret_cast<const char*>(&v), sizeof v);
  };
  add(item.dtype());
  add(chunk_size);
  for (const auto* dims :
       {&item.global_shape(), &item.box_offset(), &item.box_length()}) {
    add(dims->size());
    for (int64_t d : *dims) add(d);
  }
  return XXH3_64bits(key.data(), key.size());
}

uint64_t DigestOf(const uint64_t* hashes, size_t count) {
  return XXH3_64bits(hashes, count * sizeof(uint64_t));
}

proto::BoxDigest Box(const proto::Item& item, uint32_t chunk_size,
                     uint64_t digest) {
  proto::BoxDigest box;
  box.set_item(item.name());
  box.set_box(BoxKey(item, chunk_size));
  box.set_digest(digest);
  return box;
}

}  // namespace

absl::optional<proto::ReplicaDigests> DigestsOfStaged(
    const proto::ShardRecord& shard, const std::string& node) {
  proto::ReplicaDigests out;
  out.set_rank(shard.rank());
  out.set_world_size(shard.world_size());
  out.set_node(node);
  out.set_staged_unix_micros(shard.staged_unix_micros());
  for (const proto::StagedItem& staged : shard.items()) {
    const proto::Item& item = staged.item();
    if (item.kind() != proto::ITEM_KIND_TENSOR || staged.rank_local()) continue;
    if (staged.chunk_xxh3_size() == 0 && item.raw_size() > 0)
      return absl::nullopt;
    *out.add_boxes() =
        Box(item, staged.chunk_size(),
            DigestOf(staged.chunk_xxh3().data(), staged.chunk_xxh3_size()));
  }
  return out;
}

proto::ReplicaDigests DigestsOfManifest(const proto::ShardManifest& manifest,
                                        const std::string& node,
                                        const std::set<std::string>& skip) {
  proto::ReplicaDigests out;
  out.set_rank(manifest.rank());
  out.set_world_size(manifest.world_size());
  out.set_node(node);
  for (const proto::Item& item : manifest.items()) {
    if (item.kind() != proto::ITEM_KIND_TENSOR || skip.count(item.name()))
      continue;
    std::vector<uint64_t> hashes;
    hashes.reserve(item.chunks_size());
    for (const proto::ChunkInfo& c : item.chunks())
      hashes.push_back(c.raw_xxh3());
    *out.add_boxes() = Box(item, manifest.chunk_size(),
                           DigestOf(hashes.data(), hashes.size()));
  }
  return out;
}

namespace {

struct Replica {
  uint32_t rank;
  const std::string* node;
};

// The mismatch of one box's replicas, grouped by digest; nullopt when they
// agree.
absl::optional<proto::ReplicaMismatch> Mismatch(
    const std::string& item, uint64_t box,
    const std::map<uint64_t, std::vector<Replica>>& by_digest) {
  if (by_digest.size() < 2) return absl::nullopt;
  size_t largest = 0, runner_up = 0;
  uint64_t majority = 0;
  for (const auto& [digest, replicas] : by_digest) {
    if (replicas.size() > largest) {
      runner_up = largest;
      largest = replicas.size();
      majority = digest;
    } else {
      runner_up = std::max(runner_up, replicas.size());
    }
  }
  const bool has_majority = largest > runner_up;
  proto::ReplicaMismatch m;
  m.set_item(item);
  m.set_box(box);
  for (const auto& [digest, replicas] : by_digest) {
    for (const Replica& r : replicas) {
      if (has_majority && digest == majority) {
        m.add_majority_ranks(r.rank);
      } else {
        m.add_minority_ranks(r.rank);
        m.add_minority_nodes(*r.node);
      }
    }
  }
  return m;
}

// When each rank's shard arrived, behind the first.
void AddArrivals(const std::vector<proto::ReplicaDigests>& ranks,
                 proto::ReplicaCheck& check) {
  int64_t first = INT64_MAX;
  for (const proto::ReplicaDigests& r : ranks) {
    if (r.staged_unix_micros() == 0) return;
    first = std::min(first, r.staged_unix_micros());
  }
  std::vector<const proto::ReplicaDigests*> by_rank;
  for (const proto::ReplicaDigests& r : ranks) by_rank.push_back(&r);
  std::sort(by_rank.begin(), by_rank.end(),
            [](auto* a, auto* b) { return a->rank() < b->rank(); });
  for (const proto::ReplicaDigests* r : by_rank) {
    proto::RankArrival& a = *check.add_arrivals();
    a.set_rank(r->rank());
    a.set_node(r->node());
    a.set_staged_unix_micros(r->staged_unix_micros());
    a.set_lag_micros(r->staged_unix_micros() - first);
  }
}

}  // namespace

proto::ReplicaCheck CompareReplicas(
    const std::string& job, uint64_t step,
    const std::vector<proto::ReplicaDigests>& ranks) {
  // box -> (item, digest -> the replicas holding it)
  std::map<uint64_t,
           std::pair<std::string, std::map<uint64_t, std::vector<Replica>>>>
      boxes;
  std::map<uint64_t, size_t> replicas;
  for (const proto::ReplicaDigests& r : ranks) {
    for (const proto::BoxDigest& b : r.boxes()) {
      auto& [item, by_digest] = boxes[b.box()];
      item = b.item();
      by_digest[b.digest()].push_back({r.rank(), &r.node()});
      ++replicas[b.box()];
    }
  }
  proto::ReplicaCheck check;
  check.set_job(job);
  check.set_step(step);
  for (const auto& [box, entry] : boxes) {
    if (replicas[box] < 2) continue;
    check.set_replicated_boxes(check.replicated_boxes() + 1);
    absl::optional<proto::ReplicaMismatch> m =
        Mismatch(entry.first, box, entry.second);
    if (m.has_value()) *check.add_mismatches() = std::move(*m);
  }
  check.set_suspect(check.mismatches_size() > 0);
  AddArrivals(ranks, check);
  return check;
}

std::string DescribeMismatches(const proto::ReplicaCheck& check) {
  std::vector<std::string> lines;
  for (const proto::ReplicaMismatch& m : check.mismatches()) {
    std::vector<std::string> odd;
    for (int i = 0; i < m.minority_ranks_size(); ++i) {
      odd.push_back(absl::StrCat("rank ", m.minority_ranks(i), " (node ",
                                 m.minority_nodes(i), ")"));
    }
    lines.push_back(m.majority_ranks().empty()
                        ? absl::StrCat("item \"", m.item(), "\": replicas on ",
                                       absl::StrJoin(odd, ", "),
                                       " disagree with no majority")
                        : absl::StrCat("item \"", m.item(),
                                       "\": ", absl::StrJoin(odd, ", "),
                                       " outside the majority (ranks ",
                                       absl::StrJoin(m.majority_ranks(), ", "),
                                       ")"));
  }
  return absl::StrJoin(lines, "; ");
}

}  // namespace ckpt::daemon
