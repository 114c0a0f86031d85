#include "client/subscriber.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "client/daemon_admin.h"
#include "io/errno_status.h"
#include "io/file_system.h"
#include "io/host.h"
#include "io/status_macros.h"
#include "snapshot/box.h"
#include "snapshot/dtype.h"
#include "snapshot/names.h"

namespace ckpt::client {
namespace {

std::unique_ptr<proto::CkptPublish::Stub> StubFor(
    const std::string& socket_path) {
  return proto::CkptPublish::NewStub(grpc::CreateChannel(
      io::UnixSocketTarget(socket_path), grpc::InsecureChannelCredentials()));
}

template <typename Request, typename Response, typename Method>
absl::StatusOr<Response> Call(proto::CkptPublish::Stub* stub, Method method,
                              const Request& request, absl::string_view what,
                              const std::string& socket_path,
                              absl::Duration timeout) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  Response response;
  RETURN_IF_ERROR(FromGrpc((stub->*method)(&context, request, &response), what,
                           socket_path));
  return response;
}

snapshot::Box BoxOf(const proto::Item& item) {
  return {{item.box_offset().begin(), item.box_offset().end()},
          {item.box_length().begin(), item.box_length().end()}};
}

}  // namespace

absl::StatusOr<proto::VersionRecord> Publish(
    const std::string& socket_path, const proto::PublishRequest& request) {
  auto stub = StubFor(socket_path);
  return Call<proto::PublishRequest, proto::VersionRecord>(
      stub.get(), &proto::CkptPublish::Stub::Publish, request, "publish",
      socket_path, absl::Hours(1));
}

absl::StatusOr<proto::ListTopicsResponse> ListTopics(
    const std::string& socket_path) {
  auto stub = StubFor(socket_path);
  return Call<proto::ListTopicsRequest, proto::ListTopicsResponse>(
      stub.get(), &proto::CkptPublish::Stub::ListTopics,
      proto::ListTopicsRequest(), "listing topics", socket_path,
      absl::Seconds(30));
}

absl::StatusOr<bool> Subscribe(const std::string& socket_path,
                               const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  proto::SubscribeRequest request;
  request.set_topic(topic);
  auto stub = StubFor(socket_path);
  ASSIGN_OR_RETURN(proto::SubscribeResponse response,
                   (Call<proto::SubscribeRequest, proto::SubscribeResponse>(
                       stub.get(), &proto::CkptPublish::Stub::Subscribe,
                       request, absl::StrCat("subscribing to topic ", topic),
                       socket_path, absl::Seconds(30))));
  return !response.already();
}

Subscriber::Subscriber(std::string socket_path, std::string topic)
    : socket_path_(std::move(socket_path)),
      topic_(std::move(topic)),
      stub_(StubFor(socket_path_)) {}

absl::StatusOr<std::unique_ptr<Subscriber>> Subscriber::Connect(
    const std::string& socket_path, const std::string& topic) {
  RETURN_IF_ERROR(snapshot::ValidateTopic(topic));
  return std::unique_ptr<Subscriber>(new Subscriber(socket_path, topic));
}

absl::StatusOr<proto::VersionRecord> Subscriber::WaitForVersion(
    uint64_t after, absl::Duration timeout) {
  proto::WaitForVersionRequest request;
  request.set_topic(topic_);
  request.set_after(after);
  request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
  return Call<proto::WaitForVersionRequest, proto::VersionRecord>(
      stub_.get(), &proto::CkptPublish::Stub::WaitForVersion, request,
      absl::StrCat("waiting for a version of topic ", topic_, " above ", after),
      socket_path_, timeout + absl::Seconds(10));
}

absl::StatusOr<std::unique_ptr<PublishedVersion>> Subscriber::Open(
    uint64_t version) {
  proto::OpenVersionRequest request;
  request.set_topic(topic_);
  request.set_version(version);
  ASSIGN_OR_RETURN(proto::OpenVersionResponse opened,
                   (Call<proto::OpenVersionRequest, proto::OpenVersionResponse>(
                       stub_.get(), &proto::CkptPublish::Stub::OpenVersion,
                       request, absl::StrCat("opening topic ", topic_),
                       socket_path_, absl::Seconds(30))));
  auto out = std::unique_ptr<PublishedVersion>(new PublishedVersion());
  out->record_ = opened.record();
  snapshot::ShardReaderOptions options;
  options.direct_io = false;  // tmpfs, and reads of any size
  for (const std::string& path : opened.paths()) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<snapshot::ShardReader> reader,
        snapshot::ShardReader::Open(io::DefaultFileSystem(), path, options));
    out->readers_.push_back(std::move(reader));
    out->paths_.push_back(path);
    // Opened now: ckptd may drop the version while it is read.
    io::UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (fd.get() < 0) return io::ErrnoToStatus(errno, "opening " + path);
    out->files_.push_back(std::move(fd));
  }
  RETURN_IF_ERROR(out->Index());
  return out;
}

absl::Status PublishedVersion::Index() {
  std::set<std::string> seen;
  for (const auto& reader : readers_) {
    for (const proto::Item& item : reader->manifest().items()) {
      if (!seen.insert(item.name()).second) continue;
      PublishedItem p;
      p.name = item.name();
      p.is_tensor = item.kind() == proto::ITEM_KIND_TENSOR;
      p.dtype = item.dtype();
      if (p.is_tensor) {
        p.shape.assign(item.global_shape().begin(), item.global_shape().end());
        uint64_t elements = 1;
        for (int64_t d : p.shape) elements *= static_cast<uint64_t>(d);
        p.bytes = elements * snapshot::DTypeSize(item.dtype());
      } else {
        p.bytes = item.raw_size();
      }
      items_.push_back(std::move(p));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PublishedItem> PublishedVersion::Find(
    const std::string& name) const {
  for (const PublishedItem& item : items_) {
    if (item.name == name) return item;
  }
  return absl::NotFoundError(absl::StrCat("version ", version(), " of topic ",
                                          record_.topic(), " has no item \"",
                                          name, "\""));
}

absl::Status PublishedVersion::Read(const std::string& name,
                                    absl::Span<uint8_t> out) {
  ASSIGN_OR_RETURN(PublishedItem whole, Find(name));
  if (out.size() != whole.bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("item \"", name, "\" has ", whole.bytes,
                     " bytes; its destination ", out.size()));
  }
  if (std::optional<size_t> rank = WholeIn(whole); rank.has_value()) {
    const proto::Item& item = **readers_[*rank]->FindItem(name);
    if (ItemView::StoredInPlace(item)) {
      // One copy, from the page cache (ckptd verified every chunk).
      return ItemView::ReadInPlace(files_[*rank].get(), paths_[*rank], item,
                                   out);
    }
  }
  if (!whole.is_tensor) {
    for (const auto& reader : readers_) {
      if (reader->FindItem(name).ok()) return reader->ReadItem(name, out);
    }
  }
  const size_t width = snapshot::DTypeSize(whole.dtype);
  const snapshot::Box global{std::vector<int64_t>(whole.shape.size(), 0),
                             whole.shape};
  std::vector<snapshot::Box> read;  // boxes copied (replicas once)
  int64_t covered = 0;
  std::vector<uint8_t> part;
  for (const auto& reader : readers_) {
    absl::StatusOr<const proto::Item*> item = reader->FindItem(name);
    if (!item.ok()) continue;
    const snapshot::Box box = BoxOf(**item);
    bool replica = false;
    for (const snapshot::Box& b : read) {
      replica = replica || (b.offset == box.offset && b.length == box.length);
    }
    if (replica) continue;
    read.push_back(box);
    if (box.offset == global.offset && box.length == global.length) {
      return reader->ReadItem(name, out);  // one rank holds it whole
    }
    ASSIGN_OR_RETURN(
        ItemView * mapped,
        ViewOf(static_cast<size_t>(&reader - readers_.data()), **item));
    absl::Span<const uint8_t> bytes;
    if (mapped != nullptr) {
      bytes = mapped->bytes();
    } else {
      part.resize((*item)->raw_size());
      RETURN_IF_ERROR(reader->ReadItem(name, absl::MakeSpan(part)));
      bytes = part;
    }
    covered += snapshot::CopyBoxIntersection(bytes, box, out, global, width);
  }
  if (covered < global.elements()) {
    return absl::DataLossError(absl::StrCat(
        "item \"", name, "\" of version ", version(), ": the ranks' boxes ",
        "cover ", covered, " of its ", global.elements(), " elements"));
  }
  return absl::OkStatus();
}

absl::StatusOr<ItemView*> PublishedVersion::ViewOf(size_t rank,
                                                   const proto::Item& item) {
  absl::MutexLock lock(&mu_);
  auto key = std::make_pair(rank, item.name());
  auto it = views_.find(key);
  if (it == views_.end()) {
    absl::StatusOr<std::unique_ptr<ItemView>> view =
        ItemView::Map(files_[rank].get(), paths_[rank], item);
    if (absl::IsFailedPrecondition(view.status())) view = nullptr;
    if (!view.ok()) return view.status();
    it = views_.emplace(key, *std::move(view)).first;
  }
  return it->second.get();
}

std::optional<size_t> PublishedVersion::WholeIn(
    const PublishedItem& whole) const {
  for (size_t rank = 0; rank < readers_.size(); ++rank) {
    absl::StatusOr<const proto::Item*> item =
        readers_[rank]->FindItem(whole.name);
    if (!item.ok()) continue;
    if (!whole.is_tensor) return rank;
    const snapshot::Box box = BoxOf(**item);
    if (box.offset == std::vector<int64_t>(whole.shape.size(), 0) &&
        box.length == whole.shape) {
      return rank;
    }
  }
  return std::nullopt;
}

absl::StatusOr<absl::Span<uint8_t>> PublishedVersion::View(
    const std::string& name) {
  ASSIGN_OR_RETURN(PublishedItem whole, Find(name));
  if (std::optional<size_t> rank = WholeIn(whole); rank.has_value()) {
    ASSIGN_OR_RETURN(ItemView * view,
                     ViewOf(*rank, **readers_[*rank]->FindItem(name)));
    if (view != nullptr) return view->bytes();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "item \"", name, "\" of version ", version(),
      " is not held whole, stored in place, by one rank: read it"));
}

}  // namespace ckpt::client
