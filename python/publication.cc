#include "python/publication.h"

#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "client/checkpointer.h"
#include "client/subscriber.h"
#include "python/status_errors.h"
#include "snapshot/dtype.h"

namespace py = pybind11;

namespace ckpt::python {
namespace {

std::string SocketOr(const std::string& socket) {
  return socket.empty() ? client::DefaultSocketPath() : socket;
}

// Makes the node a subscriber of `topic`; False when it was one already.
bool Subscribe(const std::string& topic, const std::string& socket) {
  absl::StatusOr<bool> added;
  {
    py::gil_scoped_release release;
    added = client::Subscribe(SocketOr(socket), topic);
  }
  return ValueOrRaise(std::move(added));
}

py::dict Publish(const std::string& job, uint64_t step,
                 const std::string& topic,
                 const std::vector<std::string>& items, const std::string& cast,
                 const std::string& socket) {
  proto::PublishRequest request;
  request.set_job(job);
  request.set_step(step);
  request.set_topic(topic);
  for (const std::string& glob : items) request.add_items(glob);
  request.set_cast(cast);
  absl::StatusOr<proto::VersionRecord> version;
  {
    py::gil_scoped_release release;
    version = client::Publish(SocketOr(socket), request);
  }
  return VersionDict(ValueOrRaise(std::move(version)));
}

// An item's bytes mapped without a copy (PublishedVersion::View), as a
// Python buffer (writable: the mapping is private); it keeps its version
// open, so a tensor made over it (torch.frombuffer) pins the version.
struct PyVersionView {
  std::shared_ptr<client::PublishedVersion> version;
  absl::Span<uint8_t> bytes;
};

// A version opened: its files stay readable while this object lives (and
// while any view of it does).
class PyPublishedVersion {
 public:
  explicit PyPublishedVersion(std::unique_ptr<client::PublishedVersion> impl)
      : impl_(std::move(impl)) {}
  uint64_t version() const { return impl_->version(); }
  py::dict record() const { return VersionDict(impl_->record()); }
  py::list items() const {
    py::list out;
    for (const client::PublishedItem& item : impl_->items()) {
      py::dict d;
      d["name"] = item.name;
      d["tensor"] = item.is_tensor;
      d["dtype"] = item.is_tensor ? snapshot::DTypeName(item.dtype) : "";
      d["shape"] = item.shape;
      d["bytes"] = item.bytes;
      out.append(d);
    }
    return out;
  }
  // Reads item `name` whole into `nbytes` bytes at `data_ptr`.
  void ReadInto(const std::string& name, uintptr_t data_ptr, uint64_t nbytes) {
    absl::Status read;
    {
      py::gil_scoped_release release;
      read = impl_->Read(name, {reinterpret_cast<uint8_t*>(data_ptr),
                                static_cast<size_t>(nbytes)});
    }
    RaiseIfError(read);
  }
  // Item `name` mapped without a copy; None when it cannot be (read it).
  std::optional<PyVersionView> View(const std::string& name) {
    absl::StatusOr<absl::Span<uint8_t>> view;
    {
      py::gil_scoped_release release;
      view = impl_->View(name);
    }
    if (absl::IsFailedPrecondition(view.status())) return std::nullopt;
    return PyVersionView{impl_, ValueOrRaise(std::move(view))};
  }

 private:
  std::shared_ptr<client::PublishedVersion> impl_;
};

class PySubscriber {
 public:
  PySubscriber(const std::string& topic, const std::string& socket)
      : impl_(ValueOrRaise(
            client::Subscriber::Connect(SocketOr(socket), topic))) {}
  py::dict WaitForVersion(uint64_t after, double timeout_s) {
    absl::StatusOr<proto::VersionRecord> version;
    {
      py::gil_scoped_release release;
      version = impl_->WaitForVersion(after, Seconds(timeout_s));
    }
    return VersionDict(ValueOrRaise(std::move(version)));
  }
  std::unique_ptr<PyPublishedVersion> Open(uint64_t version) {
    absl::StatusOr<std::unique_ptr<client::PublishedVersion>> opened;
    {
      py::gil_scoped_release release;
      opened = impl_->Open(version);
    }
    return std::make_unique<PyPublishedVersion>(
        ValueOrRaise(std::move(opened)));
  }

 private:
  std::unique_ptr<client::Subscriber> impl_;
};

}  // namespace

py::dict VersionDict(const proto::VersionRecord& v) {
  py::dict d;
  d["topic"] = v.topic();
  d["version"] = v.version();
  d["job"] = v.job();
  d["step"] = v.step();
  d["world_size"] = v.world_size();
  d["items"] = std::vector<std::string>(v.items().begin(), v.items().end());
  d["cast"] = v.cast();
  d["bytes"] = v.bytes();
  d["source_node"] = v.source_node();
  d["created_unix_micros"] = v.created_unix_micros();
  return d;
}

void BindPublication(py::module_& m) {
  m.def("publish", &Publish, py::arg("job"), py::arg("step"), py::arg("topic"),
        py::arg("items") = std::vector<std::string>(), py::arg("cast") = "",
        py::arg("socket") = "",
        "Publishes committed `step` of `job` as the next version of `topic` "
        "(the items the globs choose; cast 'bf16': float32 items become "
        "bfloat16); returns the version's record.");
  m.def("subscribe", &Subscribe, py::arg("topic"), py::arg("socket") = "",
        "Makes the node's ckptd a subscriber of `topic`: it fetches each "
        "new version from its peers (until it stops; ckptd --subscribe "
        "keeps it). False when it was one already.");
  py::class_<PyPublishedVersion>(m, "PublishedVersion")
      .def_property_readonly("version", &PyPublishedVersion::version)
      .def("record", &PyPublishedVersion::record)
      .def("items", &PyPublishedVersion::items)
      .def("read_into", &PyPublishedVersion::ReadInto, py::arg("name"),
           py::arg("data_ptr"), py::arg("nbytes"),
           "Reads item `name` whole into `nbytes` bytes at `data_ptr`.")
      .def("view", &PyPublishedVersion::View, py::arg("name"),
           "Item `name` mapped without a copy (a buffer that keeps the "
           "version open), or None when it must be read.");
  py::class_<PyVersionView>(m, "VersionView", py::buffer_protocol())
      .def_buffer([](PyVersionView& v) {
        return py::buffer_info(v.bytes.data(), 1,
                               py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(v.bytes.size())}, {1});
      })
      .def("__len__", [](const PyVersionView& v) { return v.bytes.size(); });
  py::class_<PySubscriber>(m, "Subscriber")
      .def(py::init<const std::string&, const std::string&>(), py::arg("topic"),
           py::arg("socket") = "")
      .def("wait_for_version", &PySubscriber::WaitForVersion,
           py::arg("after") = 0, py::arg("timeout") = 600.0)
      .def("open", &PySubscriber::Open, py::arg("version") = 0);
}

}  // namespace ckpt::python
