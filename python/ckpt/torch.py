"""ckpt.torch: checkpoint a PyTorch training state through the node's ckptd.

    import ckpt.torch
    state = {"model": model, "optim": optimizer, "progress": {"epoch": 0}}
    ckp = ckpt.torch.Checkpointer(state, job="mlp")
    start = (ckp.restore() or -1) + 1       # latest committed step, in place
    for step in range(start, steps):
        ...forward, backward...
        optimizer.step()
        ckp.save_async(step).wait_staged()  # then the state may change again

`state` maps names to
  - tensors (saved whole on every rank: data-parallel replicas),
  - `Sharded(tensor, global_shape, offset)`: this rank's box of a global
    tensor, so that a restore onto another world size reshards it,
  - `torch.nn.Module`s (their state_dict: parameters and buffers),
  - `torch.optim.Optimizer`s (state tensors and param groups),
  - objects with state_dict()/load_state_dict() (e.g. LR schedulers), and
  - any other picklable value (restored by replacing `state[name]`).
Tensors are registered zero-copy by their data pointer: a save copies them
straight into ckptd's staging memory, in the background until `wait_staged()`.
The RNG states of torch, numpy and Python's random module are saved with each
step and restored with it (rng=False turns that off).

Rank and world size default to torchrun's RANK and WORLD_SIZE. Errors are the
exceptions of ckpt.errors, carrying ckptd's message.
"""

import os
import pickle
import random

import torch

from ckpt import _ckpt
from ckpt import errors

try:
    import numpy
except ImportError:  # numpy's RNG is saved only when numpy is there
    numpy = None

_DTYPES = {
    torch.bool: "bool",
    torch.uint8: "uint8",
    torch.int8: "int8",
    torch.int16: "int16",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.float64: "float64",
}
for _attr, _name in (("float8_e4m3fn", "float8_e4m3"), ("float8_e5m2",
                                                       "float8_e5m2")):
    if hasattr(torch, _attr):
        _DTYPES[getattr(torch, _attr)] = _name
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}

_META = "__ckpt__/meta"  # what the state held: kinds, optimizer skeletons
_RNG = "__ckpt__/rng"
_EXTRA = "__ckpt__/extra/"  # + key: pickled values and state_dicts
_FORMAT_VERSION = 1


class Sharded:
    """This rank's box of a global tensor: `tensor` holds the elements
    [offset[d], offset[d] + tensor.shape[d]) of each dimension d of a tensor
    of `global_shape`."""

    def __init__(self, tensor, global_shape, offset):
        self.tensor = tensor
        self.global_shape = tuple(int(d) for d in global_shape)
        self.offset = tuple(int(o) for o in offset)
        if len(self.global_shape) != tensor.dim() or len(
                self.offset) != tensor.dim():
            raise errors.InvalidArgumentError(
                f"Sharded: a {tensor.dim()}-d tensor needs a global shape and "
                f"an offset of {tensor.dim()} dims, got {self.global_shape} "
                f"and {self.offset}", "INVALID_ARGUMENT")


class _TensorRef:
    """Stands for a tensor in a pickled optimizer skeleton."""

    def __init__(self, name, dtype, shape):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)


class _Layout:
    """What one save registers: tensors (name -> (tensor, global shape,
    offset)) and byte items (name -> bytes)."""

    def __init__(self):
        self.tensors = {}
        self.bytes = {}

    def signature(self):
        return {
            name: (_DTYPES.get(t.dtype), tuple(t.shape), g, o, t.data_ptr())
            for name, (t, g, o) in self.tensors.items()
        }


def _env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"environment variable {name}={value!r} is not an integer",
            "INVALID_ARGUMENT") from None


def _rng_state():
    state = {
        "torch": torch.get_rng_state().numpy().tobytes(),
        "python": random.getstate()
    }
    if numpy is not None:
        state["numpy"] = numpy.random.get_state()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [
            s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()
        ]
    return state


def _set_rng_state(state):
    torch.set_rng_state(
        torch.frombuffer(bytearray(state["torch"]), dtype=torch.uint8))
    random.setstate(state["python"])
    if numpy is not None and "numpy" in state:
        numpy.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([
            torch.frombuffer(bytearray(s), dtype=torch.uint8)
            for s in state["cuda"]
        ])


def _kind(value):
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, Sharded):
        return "sharded"
    if isinstance(value, torch.nn.Module):
        return "module"
    if isinstance(value, torch.optim.Optimizer):
        return "optimizer"
    if callable(getattr(value, "state_dict", None)) and callable(
            getattr(value, "load_state_dict", None)):
        return "stateful"
    return "object"


class Checkpointer:
    """Checkpoints `state` (see the module's doc) as job `job` through ckptd.

    rank, world_size: this process's rank and the job's world size (default:
    RANK and WORLD_SIZE, else 0 and 1). socket: ckptd's socket (default: the
    daemon's default for this uid). device: "cpu", or "cuda" when the tensors
    live on the GPU (default: from the tensors). rng: save and restore the
    RNG states. host_snapshot: how CPU tensors are captured: "copy" (a helper
    thread copies them; wait_staged waits for it), or "fork" (a forked child
    writes them from a copy-on-write view; wait_staged waits only for the
    fork, and the trainer's first writes to its pages after it fault: see
    the README). CKPT_HOST_SNAPSHOT overrides it."""

    def __init__(self,
                 state,
                 job,
                 rank=None,
                 world_size=None,
                 socket=None,
                 rpc_timeout=30.0,
                 device=None,
                 rng=True,
                 host_snapshot="copy"):
        if not isinstance(state, dict):
            raise errors.InvalidArgumentError(
                f"state must be a dict of tensors, modules, optimizers and "
                f"picklable values, not {type(state).__name__}",
                "INVALID_ARGUMENT")
        self.state = state
        self.job = job
        self.rank = _env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = (_env_int("WORLD_SIZE", 1)
                           if world_size is None else int(world_size))
        self.socket = socket or ""
        self.rpc_timeout = rpc_timeout
        self.rng = rng
        self.host_snapshot = host_snapshot
        self._device = device
        self._native = None
        self._registered = None  # the signature the native object holds
        self._byte_names = set()
        self._sync(self._flatten())

    # --- the public API ---------------------------------------------------

    def save_async(self, step):
        """Starts saving the state as `step`; returns a handle with
        wait_staged() (after it the state may be mutated) and
        wait_committed(tier="disk", timeout=600)."""
        self._sync(self._flatten())
        return self._native.save_async(int(step))

    def save(self, step):
        """save_async(step) and wait_staged(): returns once the state may be
        mutated again; the persist goes on in ckptd."""
        handle = self.save_async(step)
        handle.wait_staged()
        return handle

    def last_save_error(self):
        """The exception of the most recent save that failed since the last
        call (a failed persist or commit), or None."""
        return self._native.last_save_error()

    def latest_committed(self, tier="disk"):
        """The newest step of the job committed at `tier`, or None."""
        return self._native.latest_committed(tier)

    def list_committed(self, tier="disk"):
        return self._native.list_committed(tier)

    def restore(self, step=None, tier="disk", strict=True):
        """Loads step `step` (default: the latest committed at `tier`) into the
        state in place and returns it; returns None when the job has no
        committed step. With `strict`, the state and the checkpoint must have
        the same keys."""
        if step is None:
            step = self.latest_committed(tier)
            if step is None:
                return None
        step = int(step)
        meta = self._read_meta(step)
        self._check_keys(meta, step, strict)
        for key, skeleton in meta["optimizers"].items():
            if key in self.state:
                self.state[key].load_state_dict(_materialize(skeleton))
        layout = self._flatten()
        missing = [n for n in meta["tensors"] if n not in layout.tensors]
        if missing and strict:
            raise errors.NotFoundError(
                f"step {step} of job {self.job} has tensors the state lacks: "
                f"{', '.join(missing[:8])}", "NOT_FOUND")
        self._sync(layout, reshaped_ok=True)
        self._native.restore(step)
        for name in layout.bytes:
            if name == _RNG:
                _set_rng_state(pickle.loads(self._native.get_bytes(name)))
            elif name.startswith(_EXTRA):
                key = name[len(_EXTRA):]
                value = pickle.loads(self._native.get_bytes(name))
                if _kind(self.state[key]) == "stateful":
                    self.state[key].load_state_dict(value)
                else:
                    self.state[key] = value
        return step

    def on_failure(self, callback):
        """Calls `callback(lost_nodes)` from a watcher thread when nodes of
        the job's cluster fail (their ckptd's etcd lease expired). Failures
        are also polled with lost_nodes()."""
        self._failure_callback = callback
        self._native.watch_failures(callback)

    def lost_nodes(self):
        return self._native.lost_nodes() if self._native is not None else []

    def rejoin(self, min_ranks, max_ranks, participant=None, settle=2.0,
               timeout=300.0):
        """Elastic restart without restarting the process: joins the job's
        next epoch, takes the rank and world size it assigns, and returns the
        epoch (a dict with epoch, rank, world_size, members, nccl_unique_id).
        Call restore() next: it reshards when the world size changed."""
        epoch = _ckpt.rejoin(self.job, min_ranks, max_ranks, participant or "",
                             self.socket, settle, timeout)
        self.rank, self.world_size = epoch["rank"], epoch["world_size"]
        self._close_native()
        self._registered = None
        self._sync(self._flatten())
        return epoch

    def reset(self):
        """Accepts tensors whose shape or dtype changed since they were
        registered (the next save registers the state afresh)."""
        self._registered = None
        self._close_native()

    def stats(self):
        return self._native.stats()

    def close(self):
        """Waits for the copy in flight and disconnects; the daemon finishes
        persisting and committing what was staged."""
        self._close_native()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- internals --------------------------------------------------------

    def _close_native(self):
        if self._native is not None:
            self._native.close()
            self._native = None

    def _connect(self, device):
        cuda_device, stream = 0, 0
        if device == "cuda":
            cuda_device = torch.cuda.current_device()
            stream = torch.cuda.current_stream().cuda_stream
        return _ckpt.Checkpointer(self.job,
                                  rank=self.rank,
                                  world_size=self.world_size,
                                  socket=self.socket,
                                  rpc_timeout=self.rpc_timeout,
                                  device=device,
                                  cuda_device=cuda_device,
                                  compute_stream=stream,
                                  host_snapshot=self.host_snapshot)

    def _flatten(self):
        """The items of the state as they are now."""
        layout = _Layout()
        kinds, optimizers = {}, {}

        def add(name, tensor, global_shape=None, offset=None):
            _check_tensor(name, tensor)
            if global_shape is None:
                global_shape, offset = tuple(tensor.shape), (0, ) * tensor.dim()
            layout.tensors[name] = (tensor, global_shape, offset)

        for key, value in self.state.items():
            if not isinstance(key, str) or not key or "/" in key:
                raise errors.InvalidArgumentError(
                    f"state key {key!r}: keys must be non-empty strings "
                    f"without '/'", "INVALID_ARGUMENT")
            kind = kinds[key] = _kind(value)
            if kind == "tensor":
                add(key, value)
            elif kind == "sharded":
                add(key, value.tensor, value.global_shape, value.offset)
            elif kind == "module":
                for name, tensor in value.state_dict().items():
                    add(f"{key}/{name}", tensor)
            elif kind == "optimizer":
                optimizers[key] = _skeleton(key, value.state_dict(), add)
            elif kind == "stateful":
                layout.bytes[_EXTRA + key] = pickle.dumps(value.state_dict())
            else:
                try:
                    layout.bytes[_EXTRA + key] = pickle.dumps(value)
                except Exception as e:
                    raise errors.InvalidArgumentError(
                        f"state key {key!r}: a {type(value).__name__} is "
                        f"neither a tensor, module, optimizer nor picklable "
                        f"({e})", "INVALID_ARGUMENT") from e
        if self.rng:
            layout.bytes[_RNG] = pickle.dumps(_rng_state())
        layout.bytes[_META] = pickle.dumps({
            "version": _FORMAT_VERSION,
            "kinds": kinds,
            "optimizers": optimizers,
            "tensors": sorted(layout.tensors),
        })
        return layout

    def _sync(self, layout, reshaped_ok=False):
        """Makes the native checkpointer hold `layout`'s items: the same
        tensors need nothing but fresh byte items; tensors that moved or
        appeared (an optimizer's state after its first step) are registered
        afresh; a tensor whose shape or dtype changed is an error unless
        `reshaped_ok` (restore) or after reset()."""
        signature = layout.signature()
        if self._registered is not None and not reshaped_ok:
            for name, now in signature.items():
                was = self._registered.get(name)
                if was is not None and was[:4] != now[:4]:
                    raise errors.InvalidArgumentError(
                        f"tensor '{name}' changed since it was registered: "
                        f"was {was[0]} {list(was[1])}, is {now[0]} "
                        f"{list(now[1])}; call reset() to accept the change",
                        "INVALID_ARGUMENT")
        if (self._native is None or signature != self._registered or
                set(layout.bytes) != self._byte_names):
            self._close_native()
            native = self._connect(self._device_for(layout))
            for name, (tensor, global_shape, offset) in layout.tensors.items():
                native.register_tensor(name,
                                       _DTYPES[tensor.dtype],
                                       tensor.data_ptr(),
                                       list(global_shape),
                                       list(offset),
                                       list(tensor.shape),
                                       owner=tensor)
            for name in layout.bytes:
                native.register_bytes(name)
            if getattr(self, "_failure_callback", None) is not None:
                native.watch_failures(self._failure_callback)
            self._native, self._registered = native, signature
            self._byte_names = set(layout.bytes)
        for name, value in layout.bytes.items():
            self._native.set_bytes(name, value)

    def _device_for(self, layout):
        if self._device is not None:
            return self._device
        devices = {t.device.type for t, _, _ in layout.tensors.values()}
        if devices == {"cuda"}:
            return "cuda"
        if devices - {"cpu"}:
            raise errors.InvalidArgumentError(
                f"the state's tensors are on {sorted(devices)}; one "
                f"checkpointer takes host tensors or tensors of one GPU",
                "INVALID_ARGUMENT")
        return "cpu"

    def _read_meta(self, step):
        probe = self._connect("cpu")
        try:
            probe.register_bytes(_META)
            probe.restore(step)
            meta = pickle.loads(probe.get_bytes(_META))
        finally:
            probe.close()
        if meta.get("version") != _FORMAT_VERSION:
            raise errors.FailedPreconditionError(
                f"step {step} of job {self.job} was saved by ckpt.torch format "
                f"{meta.get('version')}; this one reads {_FORMAT_VERSION}",
                "FAILED_PRECONDITION")
        return meta

    def _check_keys(self, meta, step, strict):
        saved, here = set(meta["kinds"]), set(self.state)
        if strict and saved != here:
            raise errors.NotFoundError(
                f"step {step} of job {self.job} holds keys "
                f"{sorted(saved)}, the state has {sorted(here)}", "NOT_FOUND")
        for key in saved & here:
            kind = _kind(self.state[key])
            if kind != meta["kinds"][key]:
                raise errors.InvalidArgumentError(
                    f"state key {key!r} is a {kind} here but was saved as a "
                    f"{meta['kinds'][key]} in step {step}", "INVALID_ARGUMENT")


def _check_tensor(name, tensor):
    if tensor.dtype not in _DTYPES:
        raise errors.InvalidArgumentError(
            f"tensor '{name}': dtype {tensor.dtype} is not supported; "
            f"supported: {', '.join(str(d) for d in _DTYPES)}",
            "INVALID_ARGUMENT")
    if tensor.is_sparse or tensor.layout != torch.strided:
        raise errors.InvalidArgumentError(
            f"tensor '{name}': layout {tensor.layout} is not supported; only "
            f"dense (strided) tensors are", "INVALID_ARGUMENT")
    if not tensor.is_contiguous():
        raise errors.InvalidArgumentError(
            f"tensor '{name}' is not contiguous (shape {list(tensor.shape)}, "
            f"strides {list(tensor.stride())}); tensors are saved zero-copy "
            f"from their memory, so make it contiguous before registering it",
            "INVALID_ARGUMENT")


def _skeleton(key, state_dict, add):
    """An optimizer's state_dict with each state tensor registered through
    `add` and replaced by a _TensorRef."""
    state = {}
    for index, per_param in state_dict["state"].items():
        entry = {}
        for field, value in per_param.items():
            if isinstance(value, torch.Tensor):
                name = f"{key}/state/{index}/{field}"
                add(name, value)
                entry[field] = _TensorRef(name, _DTYPES[value.dtype],
                                          value.shape)
            else:
                entry[field] = value
        state[index] = entry
    return {"state": state, "param_groups": state_dict["param_groups"]}


def _materialize(skeleton):
    """An optimizer state_dict from a skeleton, with uninitialized tensors of
    the saved dtypes and shapes (the restore fills them)."""
    state = {}
    for index, per_param in skeleton["state"].items():
        state[index] = {
            field: (torch.empty(value.shape, dtype=_TORCH_DTYPES[value.dtype])
                    if isinstance(value, _TensorRef) else value)
            for field, value in per_param.items()
        }
    return {"state": state, "param_groups": skeleton["param_groups"]}
