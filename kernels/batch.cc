#include "kernels/batch.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "kernels/xxh3.h"

namespace ckpt::kernels {
namespace {

uint64_t OutputsOf(Batch::Kind kind, const std::vector<TableEntry>& entries) {
  uint64_t outputs = 0;
  for (const TableEntry& e : entries) {
    outputs =
        std::max(outputs, kind == Batch::Kind::kGather ? e.at + e.n : e.at + 1);
  }
  return outputs;
}

}  // namespace

absl::StatusOr<std::vector<TableEntry>> GatherTable(
    absl::Span<const GatherPiece> pieces) {
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // offset, end
  std::vector<TableEntry> entries;
  for (const GatherPiece& p : pieces) {
    if (p.n == 0) continue;
    if (p.src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather: a piece of ", p.n, " bytes at offset ",
                       p.offset, " has no source"));
    }
    spans.emplace_back(p.offset, p.offset + p.n);
    const auto* src = static_cast<const uint8_t*>(p.src);
    for (uint64_t at = 0; at < p.n; at += kGatherEntryBytes) {
      entries.push_back(
          {src + at, std::min(kGatherEntryBytes, p.n - at), p.offset + at});
    }
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) {
      return absl::InvalidArgumentError(
          absl::StrCat("gather: the pieces at offsets ", spans[i - 1].first,
                       " and ", spans[i].first, " overlap"));
    }
  }
  return entries;
}

absl::StatusOr<std::vector<TableEntry>> HashTable(
    absl::Span<const HashRun> runs, uint64_t chunk) {
  if (chunk == 0) return absl::InvalidArgumentError("hashes: chunk size 0");
  std::vector<TableEntry> entries;
  for (const HashRun& r : runs) {
    if (r.n > 0 && r.src == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("hashes: a run of ", r.n, " bytes has no source"));
    }
    const auto* src = static_cast<const uint8_t*>(r.src);
    for (uint64_t at = 0; at < r.n; at += chunk) {
      entries.push_back({src + at, std::min(chunk, r.n - at),
                         static_cast<uint64_t>(entries.size())});
    }
  }
  return entries;
}

Batch::Batch(Kind kind, std::vector<TableEntry> entries)
    : kind_(kind),
      entries_(std::move(entries)),
      outputs_(OutputsOf(kind_, entries_)) {}

absl::StatusOr<std::unique_ptr<Batch>> NewHostGather(
    absl::Span<const GatherPiece> pieces) {
  absl::StatusOr<std::vector<TableEntry>> table = GatherTable(pieces);
  if (!table.ok()) return table.status();
  return std::make_unique<Batch>(Batch::Kind::kGather, *std::move(table));
}

absl::StatusOr<std::unique_ptr<Batch>> NewHostHashes(
    absl::Span<const HashRun> runs, uint64_t chunk) {
  absl::StatusOr<std::vector<TableEntry>> table = HashTable(runs, chunk);
  if (!table.ok()) return table.status();
  return std::make_unique<Batch>(Batch::Kind::kHashes, *std::move(table));
}

absl::Status CheckBatch(const Batch& batch, Batch::Kind kind) {
  if (batch.kind() == kind) return absl::OkStatus();
  return absl::InvalidArgumentError(
      kind == Batch::Kind::kGather ? "a batch of hashes was run as a gather"
                                   : "a gather was run as a batch of hashes");
}

void RunGatherOnHost(const Batch& batch, void* dst) {
  auto* out = static_cast<uint8_t*>(dst);
  for (const TableEntry& e : batch.entries()) {
    std::memcpy(out + e.at, e.src, e.n);
  }
}

void RunHashesOnHost(const Batch& batch, uint64_t* hashes) {
  static constexpr uint8_t kSecret[xxh3::kSecretSize] = CKPT_XXH3_SECRET;
  for (const TableEntry& e : batch.entries()) {
    hashes[e.at] = e.n <= xxh3::kMidSizeMax
                       ? xxh3::HashShort(e.src, e.n, kSecret)
                       : xxh3::HashLongAsWarp(e.src, e.n, kSecret);
  }
}

}  // namespace ckpt::kernels
