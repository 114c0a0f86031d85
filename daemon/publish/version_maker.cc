#include "daemon/publish/version_maker.h"

#include <fnmatch.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "io/status_macros.h"
#include "snapshot/cast.h"

namespace ckpt::daemon {
namespace {

constexpr char kMakingPrefix[] = ".making-";

}  // namespace

absl::Status VersionMaker::Open(const std::vector<std::string>& sources) {
  uint64_t estimate = 0;
  for (uint32_t rank = 0; rank < sources.size(); ++rank) {
    absl::StatusOr<std::unique_ptr<snapshot::ShardReader>> reader =
        snapshot::ShardReader::Open(fs_, sources[rank]);
    if (!reader.ok()) return OfRank(rank, reader.status());
    estimate += kFileOverhead;
    for (const proto::Item& item : (*reader)->manifest().items()) {
      if (Chosen(item.name())) estimate += StoredBytes(item);
    }
    readers_.push_back(*std::move(reader));
  }
  ASSIGN_OR_RETURN(room_, store_->MakeRoom(estimate, what_));
  return absl::OkStatus();
}

absl::StatusOr<proto::VersionRecord> VersionMaker::MakeFiles(absl::Time start) {
  ASSIGN_OR_RETURN(
      dir_,
      store_->NewDir(request_.topic(),
                     absl::StrCat(kMakingPrefix, absl::ToUnixMicros(start))));
  proto::VersionRecord record;
  for (uint32_t rank = 0; rank < readers_.size(); ++rank) {
    absl::StatusOr<proto::VersionFile> file = MakeRankFile(rank);
    if (!file.ok()) return OfRank(rank, file.status());
    record.set_bytes(record.bytes() + file->file_bytes());
    *record.add_files() = *std::move(file);
  }
  if (chosen_.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what_, ": no item matches --items ",
                     absl::StrJoin(request_.items(), " ")));
  }
  RETURN_IF_ERROR(room_->GrowTo(record.bytes()));
  record.set_topic(request_.topic());
  record.set_job(request_.job());
  record.set_step(request_.step());
  record.set_world_size(static_cast<uint32_t>(readers_.size()));
  *record.mutable_items() = request_.items();
  record.set_cast(request_.cast());
  record.set_created_unix_micros(absl::ToUnixMicros(absl::Now()));
  record.set_source_node(node_id_);
  return record;
}

absl::Status VersionMaker::Place(const proto::VersionRecord& numbered) {
  RETURN_IF_ERROR(store_->Place(dir_, numbered));
  placed_ = true;
  return absl::OkStatus();
}

absl::Status VersionMaker::OfRank(uint32_t rank, const absl::Status& s) const {
  return absl::Status(s.code(),
                      absl::StrCat(what_, ": rank ", rank, ": ", s.message()));
}

uint64_t VersionMaker::StoredBytes(const proto::Item& item) const {
  uint64_t bytes = item.raw_size();
  if (request_.cast() == "bf16" && item.kind() == proto::ITEM_KIND_TENSOR &&
      item.dtype() == proto::DTYPE_FLOAT32) {
    bytes /= 2;
  }
  return bytes + bytes / 256 + (8 << 10);
}

absl::StatusOr<proto::VersionFile> VersionMaker::MakeRankFile(uint32_t rank) {
  io::FileSystem* fs = fs_;
  snapshot::ShardReader& reader = *readers_[rank];
  const std::string path = io::JoinPath(dir_, VersionStore::RankFileName(rank));
  snapshot::ShardWriterOptions options;
  options.codec.codec = proto::CODEC_NONE;  // readers copy straight out
  options.direct_io = false;                // tmpfs
  snapshot::ShardWriter writer(fs, path,
                               {request_.job(), request_.step(), rank,
                                static_cast<uint32_t>(readers_.size())},
                               options);
  // Every chosen item's bytes, kept until the writer committed them, page
  // aligned: its chunks are stored in place, so readers map them
  // (client/subscriber.h's views).
  std::vector<io::AlignedBuffer> kept;
  for (const proto::Item& item : reader.manifest().items()) {
    if (!Chosen(item.name())) continue;
    chosen_.insert(item.name());
    kept.emplace_back(item.raw_size());
    RETURN_IF_ERROR(reader.ReadItem(item.name(), kept.back().span()));
    RETURN_IF_ERROR(Add(writer, item, kept));
  }
  RETURN_IF_ERROR(writer.Commit().status());
  ASSIGN_OR_RETURN(const uint64_t bytes, fs->FileSize(path));
  proto::VersionFile file;
  file.set_rank(rank);
  file.set_file_bytes(bytes);
  file.set_manifest_xxh3(writer.manifest_xxh3());
  file.set_node(node_id_);
  return file;
}

bool VersionMaker::Chosen(const std::string& name) const {
  if (request_.items().empty()) return true;
  for (const std::string& glob : request_.items()) {
    if (::fnmatch(glob.c_str(), name.c_str(), 0) == 0) return true;
  }
  return false;
}

absl::Status VersionMaker::Add(snapshot::ShardWriter& writer,
                               const proto::Item& item,
                               std::vector<io::AlignedBuffer>& kept) {
  if (item.kind() != proto::ITEM_KIND_TENSOR) {
    return writer.AddBytes(item.name(), kept.back().span());
  }
  snapshot::TensorRef tensor;
  tensor.name = item.name();
  tensor.dtype = item.dtype();
  tensor.global_shape.assign(item.global_shape().begin(),
                             item.global_shape().end());
  tensor.box_offset.assign(item.box_offset().begin(), item.box_offset().end());
  tensor.box_length.assign(item.box_length().begin(), item.box_length().end());
  if (request_.cast() == "bf16" && item.dtype() == proto::DTYPE_FLOAT32) {
    io::AlignedBuffer cast(kept.back().size() / 2);
    RETURN_IF_ERROR(
        snapshot::CastFloat32ToBfloat16(kept.back().span(), cast.span()));
    kept.back() = std::move(cast);
    tensor.dtype = proto::DTYPE_BFLOAT16;
  }
  tensor.data = kept.back().span();
  return writer.AddTensor(tensor);
}

}  // namespace ckpt::daemon
