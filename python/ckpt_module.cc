// ckpt._ckpt: the Python binding of libckpt's Checkpointer (pybind11). The
// Python package `ckpt` (python/ckpt/) wraps it; `ckpt.torch` builds on it.
//
// Every absl::Status that crosses into Python is turned into an exception of
// ckpt.errors in one place, RaiseIfError (status_errors.h), keeping the
// daemon's message. Calls that wait (RPCs, copies, restores) release the GIL.
// Publication's bindings are in publication.h.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/checkpointer.h"
#include "client/elastic.h"
#include "python/publication.h"
#include "python/status_errors.h"
#include "snapshot/dtype.h"

namespace py = pybind11;

namespace ckpt::python {
namespace {

proto::Tier ParseTier(const std::string& name) {
  if (name == "memory") return proto::TIER_MEMORY;
  if (name == "peer") return proto::TIER_PEER;
  if (name == "disk") return proto::TIER_LOCAL_DISK;
  if (name == "shared") return proto::TIER_SHARED;
  RaiseIfError(absl::InvalidArgumentError(absl::StrCat(
      "unknown tier \"", name, "\"; expected memory, peer, disk or shared")));
  return proto::TIER_UNSPECIFIED;
}

// A save in progress; see client::SaveHandle.
class PySaveHandle {
 public:
  explicit PySaveHandle(std::shared_ptr<client::SaveHandle> handle)
      : handle_(std::move(handle)) {}
  uint64_t step() const { return handle_->step(); }
  py::dict Publish(const std::string& topic,
                   const std::vector<std::string>& items,
                   const std::string& cast, double timeout_s) {
    absl::StatusOr<proto::VersionRecord> version;
    {
      py::gil_scoped_release release;
      version = handle_->Publish(topic, items, cast, Seconds(timeout_s));
    }
    return VersionDict(ValueOrRaise(std::move(version)));
  }
  void WaitStaged() {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = handle_->WaitStaged();
    }
    RaiseIfError(status);
  }
  bool Staged() { return handle_->Staged(); }
  void OrderStream(uintptr_t stream) {
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = handle_->OrderStream(reinterpret_cast<void*>(stream));
    }
    RaiseIfError(status);
  }
  void WaitCommitted(const std::string& tier, double timeout_s) {
    const proto::Tier t = ParseTier(tier);
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = handle_->WaitCommitted(t, Seconds(timeout_s));
    }
    RaiseIfError(status);
  }
  const std::shared_ptr<client::SaveHandle>& get() const { return handle_; }

 private:
  std::shared_ptr<client::SaveHandle> handle_;
};

// One rank's connection to ckptd with its registered items. Byte items are
// owned here (set_bytes/get_bytes); tensors are read in place from the
// registered addresses, and the Python objects that own them are kept alive.
class PyCheckpointer {
 public:
  PyCheckpointer(const std::string& job, uint32_t rank, uint32_t world_size,
                 const std::string& socket, double rpc_timeout_s,
                 const std::string& device, int cuda_device,
                 uintptr_t compute_stream, const std::string& host_snapshot,
                 bool read_only, bool order_compute_stream,
                 uint64_t gather_max_tensor_bytes, uint64_t gather_buffer_bytes,
                 uint64_t restore_buffer_bytes, double restore_peer_wait_s) {
    client::CheckpointerOptions options;
    if (!(restore_peer_wait_s >= 0)) {
      RaiseIfError(absl::InvalidArgumentError(
          absl::StrCat("restore_peer_wait is ", restore_peer_wait_s,
                       "; it must be 0 or more seconds")));
    }
    options.restore_peer_wait = Seconds(restore_peer_wait_s);
    options.read_only = read_only;
    options.job = job;
    options.rank = rank;
    options.world_size = world_size;
    options.socket_path = socket;
    options.rpc_timeout = Seconds(rpc_timeout_s);
    if (device == "cuda") {
      options.device = client::DeviceKind::kCuda;
    } else if (device != "cpu") {
      RaiseIfError(absl::InvalidArgumentError(absl::StrCat(
          "unknown device \"", device, "\"; expected cpu or cuda")));
    }
    options.cuda_device = cuda_device;
    options.compute_stream = reinterpret_cast<void*>(compute_stream);
    options.order_compute_stream = order_compute_stream;
    options.gather_max_tensor_bytes = gather_max_tensor_bytes;
    options.gather_buffer_bytes = gather_buffer_bytes;
    options.restore_buffer_bytes = restore_buffer_bytes;
    if (host_snapshot == "fork") {
      options.host_snapshot = client::HostSnapshot::kFork;
    } else if (host_snapshot != "copy") {
      RaiseIfError(absl::InvalidArgumentError(
          absl::StrCat("unknown host_snapshot \"", host_snapshot,
                       "\"; expected copy or fork")));
    }
    absl::StatusOr<std::unique_ptr<client::Checkpointer>> connected;
    {
      py::gil_scoped_release release;
      connected = client::Checkpointer::Connect(options);
    }
    impl_ = ValueOrRaise(std::move(connected));
  }

  void RegisterTensor(const std::string& name, const std::string& dtype,
                      uintptr_t data, std::vector<int64_t> global_shape,
                      std::optional<std::vector<int64_t>> box_offset,
                      std::optional<std::vector<int64_t>> box_length,
                      py::object owner) {
    absl::StatusOr<proto::DType> parsed = snapshot::ParseDType(dtype);
    if (!parsed.ok()) {
      RaiseIfError(absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": ", parsed.status().message())));
    }
    std::vector<int64_t> offset =
        box_offset ? *box_offset : std::vector<int64_t>(global_shape.size(), 0);
    std::vector<int64_t> length = box_length ? *box_length : global_shape;
    RaiseIfError(Live()->RegisterTensor(
        name, *parsed, reinterpret_cast<void*>(data), std::move(global_shape),
        std::move(offset), std::move(length)));
    owners_.push_back(std::move(owner));
  }

  void RegisterBytes(const std::string& name) {
    auto value = std::make_unique<std::string>();
    RaiseIfError(Live()->RegisterBytes(name, value.get()));
    bytes_[name] = std::move(value);
  }

  // Replaces a byte item's value for the next save. Waits for the copy of the
  // previous save, which may still be reading the old value.
  void SetBytes(const std::string& name, py::bytes value) {
    std::string* slot = BytesItem(name);
    WaitForCopy();
    *slot = std::string(value);
  }
  py::bytes GetBytes(const std::string& name) {
    return py::bytes(*BytesItem(name));
  }

  PySaveHandle SaveAsync(uint64_t step) {
    client::Checkpointer* impl = Live();
    absl::StatusOr<std::shared_ptr<client::SaveHandle>> handle;
    {
      py::gil_scoped_release release;
      handle = impl->SaveAsync(step);
    }
    last_ = ValueOrRaise(std::move(handle));
    return PySaveHandle(last_);
  }

  // The error of the most recent failed save since the last call, as an
  // exception object, or None.
  py::object LastSaveError() {
    absl::Status status = Live()->LastSaveError();
    if (status.ok()) return py::none();
    return ErrorFor(status);
  }

  std::optional<uint64_t> LatestCommitted(const std::string& tier) {
    const proto::Tier t = ParseTier(tier);
    client::Checkpointer* impl = Live();
    absl::StatusOr<absl::optional<uint64_t>> latest;
    {
      py::gil_scoped_release release;
      latest = impl->LatestCommitted(t);
    }
    absl::optional<uint64_t> step = ValueOrRaise(std::move(latest));
    if (!step) return std::nullopt;
    return *step;
  }

  std::vector<uint64_t> ListCommitted(const std::string& tier) {
    const proto::Tier t = ParseTier(tier);
    client::Checkpointer* impl = Live();
    absl::StatusOr<std::vector<uint64_t>> steps;
    {
      py::gil_scoped_release release;
      steps = impl->ListCommitted(t);
    }
    return ValueOrRaise(std::move(steps));
  }

  void Restore(uint64_t step) {
    client::Checkpointer* impl = Live();
    absl::Status status;
    {
      py::gil_scoped_release release;
      status = impl->Restore(step);
    }
    RaiseIfError(status);
  }

  py::dict Stats() {
    client::CheckpointerStats stats = Live()->stats();
    py::dict d;
    d["slots_mapped"] = stats.slots_mapped;
    d["slots_reused"] = stats.slots_reused;
    d["saves_forked"] = stats.saves_forked;
    d["saves_copied"] = stats.saves_copied;
    d["fork_refused"] = stats.fork_refused;
    d["huge_page_share"] = stats.huge_page_share;
    return d;
  }

  // Calls `callback(lost_nodes)` (on a watcher thread, holding the GIL) when
  // nodes leave the job's cluster.
  void WatchFailures(py::function callback) {
    // The Python callable is copied and dropped by C++ threads: only ever
    // with the GIL held.
    std::shared_ptr<py::function> holder(new py::function(std::move(callback)),
                                         [](py::function* f) {
                                           py::gil_scoped_acquire gil;
                                           delete f;
                                         });
    RaiseIfError(
        Live()->WatchFailures([holder](const std::vector<std::string>& lost) {
          py::gil_scoped_acquire gil;
          try {
            (*holder)(lost);
          } catch (py::error_already_set& e) {
            e.discard_as_unraisable("ckpt failure callback");
          }
        }));
  }
  std::vector<std::string> LostNodes() { return Live()->LostNodes(); }

  void MarkRankLocal(const std::string& name) {
    RaiseIfError(Live()->MarkRankLocal(name));
  }

  // The job's committed steps whose replicas disagree: for each, the
  // tensors and the ranks (and nodes) outside the majority.
  py::list SuspectSteps() {
    client::Checkpointer* impl = Live();
    absl::StatusOr<std::vector<proto::ReplicaCheck>> checks;
    {
      py::gil_scoped_release release;
      checks = impl->SuspectSteps();
    }
    py::list out;
    for (const proto::ReplicaCheck& c : ValueOrRaise(std::move(checks))) {
      py::list mismatches;
      for (const proto::ReplicaMismatch& m : c.mismatches()) {
        py::dict d;
        d["item"] = m.item();
        d["majority_ranks"] = std::vector<uint32_t>(m.majority_ranks().begin(),
                                                    m.majority_ranks().end());
        d["minority_ranks"] = std::vector<uint32_t>(m.minority_ranks().begin(),
                                                    m.minority_ranks().end());
        d["minority_nodes"] = std::vector<std::string>(
            m.minority_nodes().begin(), m.minority_nodes().end());
        mismatches.append(d);
      }
      py::dict step;
      step["step"] = c.step();
      step["checked_by"] = c.checked_by();
      step["mismatches"] = mismatches;
      out.append(step);
    }
    return out;
  }

  ~PyCheckpointer() {
    // The watcher thread may be waiting for the GIL to run a callback.
    py::gil_scoped_release release;
    impl_.reset();
    last_.reset();
  }

  // Waits for the copy in flight and the hand-overs, then disconnects.
  void Close() {
    if (impl_ == nullptr) return;
    py::gil_scoped_release release;
    impl_.reset();
    last_.reset();
  }
  bool closed() const { return impl_ == nullptr; }

 private:
  client::Checkpointer* Live() {
    if (impl_ == nullptr) {
      RaiseIfError(absl::FailedPreconditionError("the checkpointer is closed"));
    }
    return impl_.get();
  }
  std::string* BytesItem(const std::string& name) {
    auto it = bytes_.find(name);
    if (it == bytes_.end()) {
      RaiseIfError(absl::NotFoundError(
          absl::StrCat("\"", name, "\" is not a registered byte item")));
    }
    return it->second.get();
  }
  void WaitForCopy() {
    if (last_ == nullptr) return;
    py::gil_scoped_release release;
    (void)last_->WaitStaged();  // its error is the save's, reported there
  }

  // Declared first, destroyed last: the Checkpointer (destroyed first) may
  // still be copying from them.
  std::map<std::string, std::unique_ptr<std::string>> bytes_;
  std::vector<py::object> owners_;
  std::shared_ptr<client::SaveHandle> last_;
  std::unique_ptr<client::Checkpointer> impl_;
};

py::dict Rejoin(const std::string& job, uint32_t min_ranks, uint32_t max_ranks,
                const std::string& participant, const std::string& socket,
                double settle_s, double timeout_s, const std::string& tier) {
  const proto::Tier resume_tier = ParseTier(tier);
  absl::StatusOr<client::Epoch> epoch;
  {
    py::gil_scoped_release release;
    epoch = client::Rejoin({.job = job,
                            .socket_path = socket,
                            .participant = participant,
                            .min_ranks = min_ranks,
                            .max_ranks = max_ranks,
                            .settle = Seconds(settle_s),
                            .timeout = Seconds(timeout_s),
                            .resume_tier = resume_tier});
  }
  client::Epoch e = ValueOrRaise(std::move(epoch));
  py::dict d;
  d["epoch"] = e.epoch;
  d["rank"] = e.rank;
  d["world_size"] = e.world_size;
  d["nccl_unique_id"] = py::bytes(e.nccl_unique_id);
  d["members"] = e.members;
  d["resume_step"] = e.resume_step.has_value()
                         ? py::object(py::int_(*e.resume_step))
                         : py::object(py::none());
  return d;
}

std::vector<std::string> DTypeNames() {
  std::vector<std::string> names;
  for (proto::DType d : snapshot::AllDTypes()) {
    names.push_back(snapshot::DTypeName(d));
  }
  return names;
}

}  // namespace
}  // namespace ckpt::python

PYBIND11_MODULE(_ckpt, m) {
  using ckpt::python::PyCheckpointer;
  using ckpt::python::PySaveHandle;
  m.doc() = "libckpt's Checkpointer; use the ckpt package, not this module.";
  m.def("dtypes", &ckpt::python::DTypeNames,
        "The element types a tensor may have.");
  m.def("rejoin", &ckpt::python::Rejoin, py::arg("job"),
        py::arg("min_ranks") = 1, py::arg("max_ranks") = 1,
        py::arg("participant") = "", py::arg("socket") = "",
        py::arg("settle") = 2.0, py::arg("timeout") = 300.0,
        py::arg("tier") = "peer",
        "Elastic restart: joins the job's next epoch; returns its epoch, this "
        "process's rank, the world size, the members, a 128-byte NCCL "
        "unique id and resume_step: the newest step committed at `tier` when "
        "the epoch closed, which every member restores (None: none).");
  m.def("default_socket", &ckpt::client::DefaultSocketPath,
        "ckptd's default socket for this uid.");

  ckpt::python::BindPublication(m);

  py::class_<PySaveHandle>(m, "SaveHandle")
      .def_property_readonly("step", &PySaveHandle::step)
      .def("wait_staged", &PySaveHandle::WaitStaged,
           "Returns once the state is copied out (it may be mutated again).")
      .def_property_readonly("staged", &PySaveHandle::Staged,
                             "Whether wait_staged would return at once.")
      .def("order_stream", &PySaveHandle::OrderStream, py::arg("stream"),
           "CUDA tensors: work queued later on `stream` (a cudaStream_t as an "
           "int, e.g. torch.cuda.current_stream().cuda_stream) waits for this "
           "save's copy, without blocking the host; call it before the step "
           "that overwrites the state when order_compute_stream is off. CPU "
           "tensors: wait_staged().")
      .def("wait_committed", &PySaveHandle::WaitCommitted,
           py::arg("tier") = "disk", py::arg("timeout") = 600.0,
           "Waits until every rank's shard of the step reached `tier`.")
      .def("publish", &PySaveHandle::Publish, py::arg("topic"),
           py::arg("items") = std::vector<std::string>(), py::arg("cast") = "",
           py::arg("timeout") = 600.0,
           "Once the step is committed on disk, publishes it as the next "
           "version of `topic` (one rank calls it); returns the record.");

  py::class_<PyCheckpointer>(m, "Checkpointer")
      .def(py::init<const std::string&, uint32_t, uint32_t, const std::string&,
                    double, const std::string&, int, uintptr_t,
                    const std::string&, bool, bool, uint64_t, uint64_t,
                    uint64_t, double>(),
           py::arg("job"), py::arg("rank") = 0, py::arg("world_size") = 1,
           py::arg("socket") = "", py::arg("rpc_timeout") = 30.0,
           py::arg("device") = "cpu", py::arg("cuda_device") = 0,
           py::arg("compute_stream") = 0, py::arg("host_snapshot") = "copy",
           py::arg("read_only") = false, py::arg("order_compute_stream") = true,
           py::arg("gather_max_tensor_bytes") = uint64_t{1} << 20,
           py::arg("gather_buffer_bytes") = uint64_t{64} << 20,
           py::arg("restore_buffer_bytes") = uint64_t{256} << 20,
           py::arg("restore_peer_wait") = 60.0)
      .def("register_tensor", &PyCheckpointer::RegisterTensor, py::arg("name"),
           py::arg("dtype"), py::arg("data_ptr"), py::arg("global_shape"),
           py::arg("box_offset") = py::none(),
           py::arg("box_length") = py::none(), py::arg("owner") = py::none())
      .def("register_bytes", &PyCheckpointer::RegisterBytes, py::arg("name"))
      .def("set_bytes", &PyCheckpointer::SetBytes, py::arg("name"),
           py::arg("value"))
      .def("get_bytes", &PyCheckpointer::GetBytes, py::arg("name"))
      .def("save_async", &PyCheckpointer::SaveAsync, py::arg("step"))
      .def("last_save_error", &PyCheckpointer::LastSaveError)
      .def("latest_committed", &PyCheckpointer::LatestCommitted,
           py::arg("tier") = "disk")
      .def("list_committed", &PyCheckpointer::ListCommitted,
           py::arg("tier") = "disk")
      .def("restore", &PyCheckpointer::Restore, py::arg("step"))
      .def("stats", &PyCheckpointer::Stats)
      .def("watch_failures", &PyCheckpointer::WatchFailures,
           py::arg("callback"),
           "Calls callback(lost_nodes) when nodes leave the job's cluster.")
      .def("lost_nodes", &PyCheckpointer::LostNodes,
           "Every node lost since watch_failures started.")
      .def("mark_rank_local", &PyCheckpointer::MarkRankLocal, py::arg("name"),
           "The registered tensor holds this rank's own values even where "
           "other ranks save the same box: never compared across replicas.")
      .def("suspect_steps", &PyCheckpointer::SuspectSteps,
           "Committed steps whose replicas disagree (silent data corruption "
           "suspected), with the ranks and nodes outside the majority.")
      .def("close", &PyCheckpointer::Close)
      .def_property_readonly("closed", &PyCheckpointer::closed);
}
