#include "tools/export.h"

#include <cstring>
#include <map>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/status_macros.h"
#include "snapshot/box.h"
#include "snapshot/dtype.h"
#include "snapshot/format.h"
#include "snapshot/shard_reader.h"
#include "tools/safetensors.h"

namespace ckpt::tools {
namespace {

// Where one rank's items are read from.
class RankSource {
 public:
  // A shard file read through `fs` (a store's copy).
  static absl::StatusOr<std::unique_ptr<RankSource>> OpenFile(
      io::FileSystem* fs, const std::string& path) {
    auto source = std::unique_ptr<RankSource>(new RankSource);
    ASSIGN_OR_RETURN(source->reader_, snapshot::ShardReader::Open(fs, path));
    for (const proto::Item& item : source->reader_->manifest().items())
      source->items_.push_back(item);
    return source;
  }

  static absl::StatusOr<std::unique_ptr<RankSource>> Open(
      const proto::ShardRecord& shard) {
    auto source = std::unique_ptr<RankSource>(new RankSource);
    if (shard.state() == proto::SHARD_PERSISTED &&
        !shard.shard_path().empty()) {
      return OpenFile(io::DefaultFileSystem(), shard.shard_path());
    }
    if (shard.slot_path().empty() || shard.state() == proto::SHARD_STAGING) {
      return absl::NotFoundError(
          absl::StrCat("rank ", shard.rank(), " of step ", shard.step(),
                       " has neither a persisted shard nor a staging slot"));
    }
    ASSIGN_OR_RETURN(source->slot_,
                     io::DefaultFileSystem()->MapFile(shard.slot_path(),
                                                      {.writable = false}));
    for (const proto::StagedItem& staged : shard.items()) {
      source->items_.push_back(staged.item());
      source->slot_offsets_[staged.item().name()] = staged.slot_offset();
    }
    return source;
  }

  const std::vector<proto::Item>& items() const { return items_; }

  absl::Status Read(const proto::Item& item, absl::Span<uint8_t> out) {
    if (reader_ != nullptr) return reader_->ReadItem(item.name(), out);
    const uint64_t at = slot_offsets_[item.name()];
    if (at > slot_->size() || out.size() > slot_->size() - at) {
      return absl::DataLossError(absl::StrCat(
          "item \"", item.name(), "\" lies past the end of ", slot_->path()));
    }
    std::memcpy(out.data(), slot_->data() + at, out.size());
    return absl::OkStatus();
  }

 private:
  std::unique_ptr<snapshot::ShardReader> reader_;
  std::unique_ptr<io::MappedFile> slot_;
  std::map<std::string, uint64_t> slot_offsets_;
  std::vector<proto::Item> items_;
};

struct Piece {
  RankSource* source;
  proto::Item item;
};

struct Tensor {
  proto::DType dtype = proto::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
  std::vector<Piece> pieces;
};

snapshot::Box BoxOf(const proto::Item& item) {
  return {{item.box_offset().begin(), item.box_offset().end()},
          {item.box_length().begin(), item.box_length().end()}};
}

// The global tensors of `world` ranks' sources, written to `out`.
absl::StatusOr<ExportStats> Assemble(
    const std::string& what, const std::string& job, uint64_t step,
    uint32_t world, const std::vector<std::unique_ptr<RankSource>>& sources,
    const std::string& out,
    const std::function<void(int done, int total)>& progress) {
  std::vector<uint32_t> missing;
  for (uint32_t r = 0; r < world; ++r) {
    if (sources[r] == nullptr) missing.push_back(r);
  }
  if (!missing.empty()) {
    return absl::NotFoundError(absl::StrCat(what, ": no shard of rank(s) ",
                                            absl::StrJoin(missing, ", "),
                                            " of ", world));
  }

  std::map<std::string, Tensor> tensors;
  for (uint32_t r = 0; r < world; ++r) {
    for (const proto::Item& item : sources[r]->items()) {
      if (item.kind() != proto::ITEM_KIND_TENSOR) {
        Tensor& t = tensors[absl::StrCat(item.name(), "@rank", r)];
        t.dtype = proto::DTYPE_UINT8;
        t.shape = {static_cast<int64_t>(item.raw_size())};
        proto::Item as_tensor = item;
        as_tensor.add_box_offset(0);
        as_tensor.add_box_length(static_cast<int64_t>(item.raw_size()));
        t.pieces.push_back({sources[r].get(), std::move(as_tensor)});
        continue;
      }
      Tensor& t = tensors[item.name()];
      std::vector<int64_t> shape(item.global_shape().begin(),
                                 item.global_shape().end());
      if (t.pieces.empty()) {
        t.dtype = item.dtype();
        t.shape = shape;
      } else if (t.dtype != item.dtype() || t.shape != shape) {
        return absl::DataLossError(absl::StrCat(
            what, ": tensor \"", item.name(), "\" is ",
            snapshot::DTypeName(item.dtype()), " [", absl::StrJoin(shape, ","),
            "] on rank ", r, " but ", snapshot::DTypeName(t.dtype), " [",
            absl::StrJoin(t.shape, ","), "] on another rank"));
      }
      t.pieces.push_back({sources[r].get(), item});
    }
  }

  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    int64_t elements = 1;
    for (int64_t d : t.shape) elements *= d;
    entries.push_back(
        {name, t.dtype, t.shape,
         static_cast<uint64_t>(elements) * snapshot::DTypeSize(t.dtype)});
  }
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsWriter> writer,
                   SafetensorsWriter::Create(
                       io::DefaultFileSystem(), out, entries,
                       {{"ckpt.job", job},
                        {"ckpt.step", absl::StrCat(step)},
                        {"ckpt.world_size", absl::StrCat(world)},
                        {"ckpt.byte_items",
                         "exported as U8 tensors named <item>@rank<r>"}}));
  ExportStats stats;
  size_t index = 0;
  for (const auto& [name, t] : tensors) {
    const SafetensorsEntry& entry = entries[index++];
    const size_t width = snapshot::DTypeSize(t.dtype);
    const snapshot::Box whole{std::vector<int64_t>(t.shape.size(), 0), t.shape};
    io::AlignedBuffer full(entry.bytes);
    full.set_size(entry.bytes);
    int64_t covered = 0;
    for (const Piece& piece : t.pieces) {
      std::vector<uint8_t> part(piece.item.raw_size());
      RETURN_IF_ERROR(piece.source->Read(piece.item, absl::MakeSpan(part)));
      covered += snapshot::CopyBoxIntersection(
          part, BoxOf(piece.item), absl::MakeSpan(full.data(), entry.bytes),
          whole, width);
    }
    if (covered != whole.elements()) {
      return absl::DataLossError(
          absl::StrCat(what, ": the shards of tensor \"", name, "\" cover ",
                       covered, " element(s) of ", whole.elements(),
                       covered > whole.elements() ? " (boxes overlap)" : ""));
    }
    RETURN_IF_ERROR(writer->Append(std::move(full)));
    ++stats.tensors;
    stats.bytes += entry.bytes;
    if (progress) progress(stats.tensors, static_cast<int>(entries.size()));
  }
  RETURN_IF_ERROR(writer->Commit());
  return stats;
}

}  // namespace

absl::StatusOr<ExportStats> ExportSafetensors(
    DataDirView& view, const std::string& job, uint64_t step,
    const std::string& out,
    const std::function<void(int done, int total)>& progress) {
  const std::string what = absl::StrCat("exporting job ", job, " step ", step);
  ASSIGN_OR_RETURN(std::vector<proto::ShardRecord> shards,
                   view.StepShards(job, step));
  ASSIGN_OR_RETURN(std::vector<proto::CommitRecord> commits, view.Commits(job));
  bool committed = false;
  for (const proto::CommitRecord& c : commits) committed |= c.step() == step;
  if (!committed) {
    return absl::FailedPreconditionError(absl::StrCat(
        what,
        ": the step is not committed at any tier; only committed steps "
        "are exported (ckpt ls ",
        job, ")"));
  }
  const uint32_t world = shards.front().world_size();
  std::vector<std::unique_ptr<RankSource>> sources(world);
  for (const proto::ShardRecord& shard : shards) {
    if (shard.rank() >= world) continue;
    absl::StatusOr<std::unique_ptr<RankSource>> source =
        RankSource::Open(shard);
    if (!source.ok()) {
      return absl::Status(source.status().code(),
                          absl::StrCat(what, ": ", source.status().message()));
    }
    sources[shard.rank()] = *std::move(source);
  }
  return Assemble(what, job, step, world, sources, out, progress);
}

absl::StatusOr<ExportStats> ExportSafetensorsFromStore(
    io::FileSystem* fs, const std::string& job_dir, const std::string& job,
    uint64_t step, uint32_t world, const std::string& out,
    const std::function<void(int done, int total)>& progress) {
  const std::string what =
      absl::StrCat("exporting step ", step, " of ", job_dir);
  std::vector<std::unique_ptr<RankSource>> sources(world);
  for (uint32_t r = 0; r < world; ++r) {
    const std::string path =
        io::JoinPath(job_dir, snapshot::ShardFileName(step, r, ".ckpt"));
    absl::StatusOr<std::unique_ptr<RankSource>> source =
        RankSource::OpenFile(fs, path);
    if (!source.ok()) {
      return absl::Status(source.status().code(),
                          absl::StrCat(what, ": ", source.status().message()));
    }
    sources[r] = *std::move(source);
  }
  return Assemble(what, job, step, world, sources, out, progress);
}

}  // namespace ckpt::tools
