"""ckpt.torch.dcp: torch.distributed.checkpoint (DCP) storage through ckptd.

    import torch.distributed.checkpoint as dcp
    from ckpt.torch.dcp import CkptStorageWriter, CkptStorageReader

    dcp.save(state_dict, storage_writer=CkptStorageWriter("llm"),
             checkpoint_id=step)                     # or step=step
    future = dcp.async_save(state_dict,
                            storage_writer=CkptStorageWriter("llm", step=step))
    dcp.load(state_dict, storage_reader=CkptStorageReader("llm"))  # latest

DCP keeps its planners (deduplication of replicas, resharding on load); the
bytes go through ckptd: each rank's chunks are staged into the memory tier,
the step commits when every rank's shard is safe (ckptd's vote), and ckptd
persists and replicates it. A step is a ckptd step of the job: `ckpt ls`,
`ckpt verify` and ckpt.torch.Checkpointer's retention see it.

With dcp.async_save the writer is the stager (DCP's AsyncStager): it copies
the state straight into ckptd's staging slot, registered once and reused, and
the save's blocking part is that copy; DCP's planning, the commit and the
wait for `wait_for` run in DCP's background thread. DCP passes checkpoint_id
to the writer only after staging, so an async save names its step with
`step=` (a dcp.save may give it as checkpoint_id instead).

What a step holds, per rank: each tensor chunk the rank wrote as the ckptd
tensor item "dcp/t/<fqn>" at its place in the global tensor, and one byte item
"dcp/index" listing them with DCP's tensor properties plus the rank's
non-tensor values (serialized as DCP serializes them). The reader builds DCP's
Metadata from the ranks' indexes and reads each box it needs; ckptd assembles
a box from the saved chunks it overlaps.
"""

import atexit
import io
import pickle
import re
import threading

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                   ChunkStorageMetadata,
                                                   Metadata, MetadataIndex,
                                                   StorageMeta,
                                                   TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType,
                                                  WriteItemType)
from torch.distributed.checkpoint.storage import (StorageReader,
                                                  StorageWriter, WriteResult)

try:
    from torch.distributed.checkpoint.staging import AsyncStager
except ImportError:  # PyTorch < 2.3: no async staging protocol
    AsyncStager = object
try:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
except ImportError:
    flatten_state_dict = None

from ckpt import errors
from ckpt.torch import _unpickle
from ckpt.torch import _state
from ckpt.torch._native import NativeBinding

_INDEX = "dcp/index"
_TENSOR = "dcp/t/"
_FORMAT = 1
_ID = re.compile(r"^ckpt://([A-Za-z0-9._-]+)/(\d+)$")

# One native binding per (job, rank, world, socket, mode), shared by the
# writers of a process: a writer per step re-registers nothing when the
# state's tensors stay where they were.
_bindings = {}
_bindings_lock = threading.Lock()


def close():
    """Closes the native bindings this process's DCP writers share (their
    Checkpointers: the session with ckptd and the registered slot). Run at
    interpreter exit too, while the interpreter is whole: left to the
    interpreter's teardown, a native object's threads may outlive what they
    use. A later writer opens a new binding."""
    with _bindings_lock:
        bindings = list(_bindings.values())
        _bindings.clear()
    for binding in bindings:
        binding.close()


atexit.register(close)


def _rank_and_world(rank, world_size):
    if dist.is_available() and dist.is_initialized():
        default_rank, default_world = dist.get_rank(), dist.get_world_size()
    else:
        default_rank = _state.env_int("RANK", 0)
        default_world = _state.env_int("WORLD_SIZE", 1)
    return (default_rank if rank is None else int(rank),
            default_world if world_size is None else int(world_size))


def _step_of(job, checkpoint_id):
    """The step a checkpoint_id names: an int, "123", or "ckpt://job/123"."""
    if checkpoint_id is None:
        return None
    if isinstance(checkpoint_id, int):
        return checkpoint_id
    text = str(checkpoint_id)
    if text.isdigit():
        return int(text)
    match = _ID.match(text)
    if match and match.group(1) == job:
        return int(match.group(2))
    raise errors.InvalidArgumentError(
        f"checkpoint_id {text!r} names no step of job {job}: give a step "
        f"number or ckpt://{job}/STEP", "INVALID_ARGUMENT")


def _valid_id(checkpoint_id):
    if isinstance(checkpoint_id, int):
        return checkpoint_id >= 0
    text = str(checkpoint_id)
    return text.isdigit() or _ID.match(text) is not None


class _Options:

    def __init__(self, job, socket, rank, world_size, rpc_timeout,
                 host_snapshot):
        self.job, self.socket = job, socket or ""
        self.rank, self.world_size = _rank_and_world(rank, world_size)
        self.rpc_timeout, self.host_snapshot = rpc_timeout, host_snapshot

    def binding(self, mode):
        key = (self.job, self.rank, self.world_size, self.socket, mode)
        with _bindings_lock:
            if key not in _bindings:
                _bindings[key] = NativeBinding(self.job, self.rank,
                                               self.world_size, self.socket,
                                               self.rpc_timeout,
                                               self.host_snapshot)
            return _bindings[key]

    def probe(self):
        """A binding that reads: its restores leave newer shards alone."""
        return NativeBinding(self.job, self.rank, self.world_size, self.socket,
                             self.rpc_timeout, self.host_snapshot,
                             read_only=True)


class _Capture:
    """What a rank saves: its tensor chunks and its index (see the module's
    doc)."""

    def __init__(self, rank, world_size):
        self.layout = _state.Layout()
        self.index = {
            "version": _FORMAT,
            "rank": rank,
            "world_size": world_size,
            "tensors": {},  # fqn -> [(properties, size, offsets, sizes)]
            "bytes": {},  # fqn -> DCP's serialization
        }

    def add_tensor(self, fqn, local, size, offsets, properties):
        local = local.detach()
        if not local.is_contiguous():
            local = local.contiguous()
        self.index["tensors"].setdefault(fqn, []).append(
            (properties, tuple(size), tuple(offsets), tuple(local.shape)))
        if local.numel() > 0:
            self.layout.add_box(_TENSOR + fqn, local, size, offsets)

    def add_bytes(self, fqn, data):
        self.index["bytes"][fqn] = data

    def finish(self):
        self.layout.bytes[_INDEX] = pickle.dumps(self.index)
        return self.layout

    def names(self):
        return set(self.index["tensors"]) | set(self.index["bytes"])


class CkptStorageWriter(StorageWriter, AsyncStager):
    """Writes DCP checkpoints as steps of ckptd job `job`.

    step: the step (else checkpoint_id names it). wait_for: the tier whose
    commit a save waits for before it returns ("memory", "disk", or None not
    to wait; dcp.async_save waits in its background thread). rank,
    world_size: default to the default process group's, else RANK and
    WORLD_SIZE. socket: ckptd's socket."""

    _synchronize_after_execute = False  # stage() returns once copied

    def __init__(self,
                 job,
                 step=None,
                 socket=None,
                 wait_for="disk",
                 timeout=600.0,
                 rank=None,
                 world_size=None,
                 rpc_timeout=30.0,
                 host_snapshot="copy"):
        super().__init__()
        if wait_for not in ("memory", "disk", None):
            raise errors.InvalidArgumentError(
                f"wait_for={wait_for!r}: give 'memory', 'disk' or None",
                "INVALID_ARGUMENT")
        self.step = None if step is None else int(step)
        self.wait_for, self.timeout = wait_for, timeout
        self._options = _Options(job, socket, rank, world_size, rpc_timeout,
                                 host_snapshot)
        self._staged = None  # (step, names, capture) of the last stage()
        self._handle = None
        self._coordinator = False

    @property
    def should_synchronize_after_execute(self):
        return False

    # --- AsyncStager: dcp.async_save's blocking part ----------------------

    def stage(self, state_dict):
        """Copies the state into ckptd's staging slot as step `step` and
        returns `state_dict` itself: the copy is taken, the trainer may
        mutate the state as soon as this returns."""
        if self.step is None:
            raise errors.InvalidArgumentError(
                f"CkptStorageWriter(job={self._options.job!r}) has no step: "
                f"dcp.async_save stages before it passes checkpoint_id, so "
                f"give step= to the writer", "INVALID_ARGUMENT")
        if flatten_state_dict is None:
            raise errors.FailedPreconditionError(
                f"PyTorch {torch.__version__} has no DCP state-dict flattening"
                f"; stage needs PyTorch 2.3 or newer", "FAILED_PRECONDITION")
        flat, _ = flatten_state_dict(state_dict)
        capture = _Capture(self._options.rank, self._options.world_size)
        for fqn, value in flat.items():
            if isinstance(value, torch.Tensor):
                local, size, offsets = _state.local_box(fqn, value)
                capture.add_tensor(fqn, local, size, offsets,
                                   TensorProperties.create_from_tensor(local))
            else:
                buffer = io.BytesIO()
                torch.save(value, buffer)
                capture.add_bytes(fqn, buffer.getvalue())
        self._handle = self._save(capture, "stage")
        self._staged = (self.step, capture)
        return state_dict

    def synchronize_staging(self):
        pass  # stage() returns after the copy

    def close(self):
        pass  # the native binding is shared by the process's writers

    # --- StorageWriter ----------------------------------------------------

    def reset(self, checkpoint_id=None):
        step = _step_of(self._options.job, checkpoint_id)
        if step is not None:
            if self._staged is not None and self._staged[0] != step:
                raise errors.InvalidArgumentError(
                    f"checkpoint_id {checkpoint_id!r} names step {step}, but "
                    f"the writer staged step {self._staged[0]}",
                    "INVALID_ARGUMENT")
            self.step = step
        if self.step is None:
            raise errors.InvalidArgumentError(
                f"CkptStorageWriter(job={self._options.job!r}) has no step: "
                f"give step= or a checkpoint_id (a step number or "
                f"ckpt://{self._options.job}/STEP)", "INVALID_ARGUMENT")

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self._coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        if self._staged is not None and self._staged[0] == self.step:
            results = self._staged_results(plan, self._staged[1])
        else:
            results = self._write(plan, planner)
        future = torch.futures.Future()
        future.set_result(results)
        return future

    def finish(self, metadata, results):
        """On the coordinator: waits until the step is committed at
        `wait_for`. A step commits once every rank's shard is safe."""
        handle, self._handle, self._staged = self._handle, None, None
        if self.wait_for is not None and handle is not None:
            handle.wait_committed(self.wait_for, self.timeout)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)

    def storage_meta(self):
        return StorageMeta(
            checkpoint_id=f"ckpt://{self._options.job}/{self.step}")

    # --- internals --------------------------------------------------------

    def _save(self, capture, mode):
        binding = self._options.binding(mode)
        handle = binding.sync(capture.finish()).save_async(self.step)
        handle.wait_staged()
        return handle

    def _write(self, plan, planner):
        """dcp.save: captures the items DCP's plan gives this rank."""
        capture = _Capture(self._options.rank, self._options.world_size)
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                capture.add_bytes(item.index.fqn, data.getvalue())
            else:
                chunk = item.tensor_data.chunk
                capture.add_tensor(item.index.fqn, data,
                                   item.tensor_data.size, chunk.offsets,
                                   item.tensor_data.properties)
        self._handle = self._save(capture, "write")
        return [self._result(item) for item in plan.items]

    def _staged_results(self, plan, capture):
        """dcp.async_save: stage() captured the whole state; the plan must
        ask for nothing else."""
        tensors = capture.index["tensors"]
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                ok = fqn in capture.index["bytes"]
            else:
                offsets = tuple(item.tensor_data.chunk.offsets)
                ok = any(o == offsets for _, _, o, _ in tensors.get(fqn, []))
            if not ok:
                raise errors.FailedPreconditionError(
                    f"DCP's plan writes '{fqn}' (offset "
                    f"{getattr(item.index, 'offset', None)}), which stage() "
                    f"did not capture; the planner names items otherwise "
                    f"than DCP's flatten_state_dict", "FAILED_PRECONDITION")
        return [self._result(item) for item in plan.items]

    def _result(self, item):
        size = 0
        if item.tensor_data is not None:
            sizes = item.tensor_data.chunk.sizes
            size = int(torch.Size(sizes).numel()) * _element_size(
                item.tensor_data.properties.dtype)
        return WriteResult(index=item.index,
                           size_in_bytes=size,
                           storage_data=self._options.rank)


def _element_size(dtype):
    return torch.empty((), dtype=dtype).element_size()


class CkptStorageReader(StorageReader):
    """Reads DCP checkpoints from ckptd job `job`: step `step`, else the one
    checkpoint_id names, else the newest committed at `tier`. Each rank's
    index is unpickled through ckpt's allow-list (see ckpt.torch.Checkpointer:
    trusted_globals, unsafe_pickle); DCP itself deserializes non-tensor
    values."""

    def __init__(self,
                 job,
                 step=None,
                 socket=None,
                 tier="disk",
                 rank=None,
                 world_size=None,
                 rpc_timeout=30.0,
                 trusted_globals=(),
                 unsafe_pickle=False):
        super().__init__()
        self._unpickle = _unpickle.Policy(trusted_globals, unsafe_pickle)
        self.step = None if step is None else int(step)
        self.tier = tier
        self._options = _Options(job, socket, rank, world_size, rpc_timeout,
                                 "copy")
        self._bytes = {}
        self._dtypes = {}

    def reset(self, checkpoint_id=None):
        step = _step_of(self._options.job, checkpoint_id)
        if step is not None:
            self.step = step

    def read_metadata(self, *args, **kwargs):
        if kwargs.get("rank") is not None:
            raise errors.NotFoundError(
                "ckpt.torch.dcp keeps no per-rank metadata: a step's is built "
                "from every rank's index", "NOT_FOUND")
        probe = self._options.probe()
        if self.step is None:
            native = probe.connect("cpu")
            try:
                self.step = native.latest_committed(self.tier)
            finally:
                native.close()
            if self.step is None:
                raise errors.NotFoundError(
                    f"job {self._options.job} has no step committed at "
                    f"{self.tier}", "NOT_FOUND")
        first = self._index(probe, 0)
        indexes = [first] + [
            self._index(probe, r) for r in range(1, first["world_size"])
        ]
        return self._metadata(indexes)

    def set_up_storage_reader(self, metadata, is_coordinator, *args,
                              **kwargs):
        self._metadata_seen = metadata

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        tensor_items = []
        for item in plan.items:
            if item.type == LoadItemType.BYTE_IO:
                fqn = item.storage_index.fqn
                self._unpickle.check_torch_bytes(
                    self._bytes[fqn], f"step {self.step} of job "
                    f"{self._options.job}, value {fqn!r}")
                planner.load_bytes(item, io.BytesIO(self._bytes[fqn]))
            else:
                tensor_items.append(item)
        for round_ in _rounds(tensor_items):
            self._read_round(round_, planner)
        future = torch.futures.Future()
        future.set_result(None)
        return future

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return _valid_id(checkpoint_id)

    # --- internals --------------------------------------------------------

    def _index(self, probe, rank):
        try:
            data = probe.read_bytes(self.step, [_INDEX], rank=rank)[_INDEX]
        except errors.NotFoundError as e:
            if "was not saved" not in str(e):
                raise
            raise errors.FailedPreconditionError(
                f"step {self.step} of job {self._options.job} was not written "
                f"through ckpt.torch.dcp (rank {rank} saved no {_INDEX!r}); "
                f"restore it with ckpt.torch.Checkpointer",
                "FAILED_PRECONDITION") from e
        index = self._unpickle.loads(
            data, f"step {self.step} of job {self._options.job}, rank {rank}'s "
            f"{_INDEX}")
        if index.get("version") != _FORMAT or index.get("rank") != rank:
            raise errors.FailedPreconditionError(
                f"step {self.step} of job {self._options.job} is not a DCP "
                f"checkpoint written by ckpt.torch.dcp format {_FORMAT} (rank "
                f"{rank}'s index holds {index.get('version')!r}, rank "
                f"{index.get('rank')!r})", "FAILED_PRECONDITION")
        return index

    def _metadata(self, indexes):
        state, storage = {}, {}
        for index in indexes:
            for fqn, data in index["bytes"].items():
                state[fqn] = BytesStorageMetadata()
                self._bytes.setdefault(fqn, data)
                storage.setdefault(MetadataIndex(fqn), index["rank"])
            for fqn, chunks in index["tensors"].items():
                for properties, size, offsets, sizes in chunks:
                    md = state.get(fqn)
                    if md is None:
                        md = state[fqn] = TensorStorageMetadata(
                            properties=properties,
                            size=torch.Size(size),
                            chunks=[])
                        self._dtypes[fqn] = properties.dtype
                    key = MetadataIndex(fqn, torch.Size(offsets))
                    if key in storage:
                        continue  # a replica of a chunk seen already
                    storage[key] = index["rank"]
                    md.chunks.append(
                        ChunkStorageMetadata(offsets=torch.Size(offsets),
                                             sizes=torch.Size(sizes)))
        return Metadata(state_dict_metadata=state,
                        storage_data=storage,
                        storage_meta=StorageMeta(
                            checkpoint_id=f"ckpt://{self._options.job}/"
                            f"{self.step}"))

    def _read_round(self, groups, planner):
        """Reads one box per destination chunk (items with one dest_index),
        the bounding box of what its items need, then copies each item's
        part into the planner's tensor."""
        layout, boxes = _state.Layout(), {}
        for dest, items in groups.items():
            fqn = items[0].storage_index.fqn
            starts = [[
                o + s for o, s in zip(i.storage_index.offset, i.storage_offsets)
            ] for i in items]
            lo = [min(c) for c in zip(*starts)]
            hi = [
                max(s + n
                    for s, n in zip(col, lens))
                for col, lens in zip(zip(*starts), zip(*[i.lengths for i in items]))
            ]
            shape = [h - l for h, l in zip(hi, lo)]
            temp = torch.empty(shape, dtype=self._dtypes[fqn])
            md = self._metadata_seen.state_dict_metadata[fqn]
            if temp.numel() > 0:
                layout.add_box(_TENSOR + fqn, temp, tuple(md.size), tuple(lo))
            boxes[dest] = (temp, lo, starts)
        if layout.tensors:
            binding = self._options.probe()
            try:
                binding.sync(layout, reshaped_ok=True).restore(self.step)
            finally:
                binding.close()
        for dest, items in groups.items():
            temp, lo, starts = boxes[dest]
            for item, start in zip(items, starts):
                part = temp
                for d, (s, n) in enumerate(zip(start, item.lengths)):
                    part = part.narrow(d, s - lo[d], n)
                target = planner.resolve_tensor(item).detach()
                if target.shape != part.shape:
                    raise errors.InvalidArgumentError(
                        f"tensor '{item.storage_index.fqn}': the load plan "
                        f"wants {list(target.shape)} where step {self.step} "
                        f"gives {list(part.shape)}", "INVALID_ARGUMENT")
                target.copy_(part)
                planner.commit_tensor(item, target)


def _rounds(items):
    """Groups read items by destination chunk, and the groups into rounds in
    which each fqn appears once (ckptd restores one box per item name)."""
    groups = {}
    for item in items:
        groups.setdefault(item.dest_index, []).append(item)
    rounds = []
    for dest, members in groups.items():
        fqn = members[0].storage_index.fqn
        for round_ in rounds:
            if all(m[0].storage_index.fqn != fqn for m in round_.values()):
                round_[dest] = members
                break
        else:
            rounds.append({dest: members})
    return rounds
