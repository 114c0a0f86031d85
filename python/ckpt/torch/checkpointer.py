"""ckpt.torch.Checkpointer: checkpoint a PyTorch training state through the
node's ckptd (see the package's doc for what a state may hold)."""

import pickle

import torch

from ckpt import _ckpt
from ckpt import errors
from ckpt.torch import _state
from ckpt.torch import _unpickle
from ckpt.torch._native import NativeBinding
from ckpt.torch._state import TensorRef

_META = "__ckpt__/meta"  # what the state held: kinds, skeletons
_RNG = "__ckpt__/rng"
_EXTRA = "__ckpt__/extra/"  # + key: pickled values and state_dicts
_FORMAT_VERSION = 1


class Checkpointer:
    """Checkpoints `state` (see the package's doc) as job `job` through ckptd.

    rank, world_size: this process's rank and the job's world size (default:
    RANK and WORLD_SIZE, else 0 and 1). socket: ckptd's socket (default: the
    daemon's default for this uid). device: "cpu", or "cuda" when the tensors
    live on the GPU (default: from the tensors). rng: save and restore the
    RNG states. host_snapshot: how CPU tensors are captured: "copy" (a helper
    thread copies them; wait_staged waits for it), or "fork" (a forked child
    writes them from a copy-on-write view; wait_staged waits only for the
    fork, and the trainer's first writes to its pages after it fault: see
    docs/trainers.md). CKPT_HOST_SNAPSHOT overrides it. trusted_globals,
    unsafe_pickle: restores unpickle the saved values through an allow-list
    (containers, scalars, tensors, numpy arrays: see ckpt.torch._unpickle)
    and refuse any other class a pickle names, as torch.load(weights_only=
    True) does; trusted_globals adds classes (or "module.name"), and
    unsafe_pickle=True trusts the checkpoint with everything.
    restore_peer_wait: seconds a restore waits while the node that may hold
    the only copy of this rank's shard restarts (ckptd names it), asking
    again, before it raises ckptd's UNAVAILABLE. rank_local: state keys whose
    plain tensors hold each rank's own values (not data-parallel replicas):
    ckptd compares the replicas of every other tensor across ranks after each
    step and marks a step whose replicas disagree suspect (silent data
    corruption, see suspect_steps()); these are never compared."""

    def __init__(self,
                 state,
                 job,
                 rank=None,
                 world_size=None,
                 socket=None,
                 rpc_timeout=30.0,
                 device=None,
                 rng=True,
                 host_snapshot="copy",
                 trusted_globals=(),
                 unsafe_pickle=False,
                 restore_peer_wait=60.0,
                 rank_local=()):
        if not isinstance(state, dict):
            raise errors.InvalidArgumentError(
                f"state must be a dict of tensors, modules, optimizers and "
                f"picklable values, not {type(state).__name__}",
                "INVALID_ARGUMENT")
        self.state = state
        self.job = job
        self.rank = _state.env_int("RANK", 0) if rank is None else int(rank)
        self.world_size = (_state.env_int("WORLD_SIZE", 1)
                           if world_size is None else int(world_size))
        self.socket = socket or ""
        self.rng = rng
        self._unpickle = _unpickle.Policy(trusted_globals, unsafe_pickle)
        self._resume = None  # the epoch of the last rejoin(), until restore()
        rank_local = (rank_local,) if isinstance(rank_local, str) else tuple(
            rank_local)
        for key in rank_local:
            if key not in state:
                raise errors.InvalidArgumentError(
                    f"rank_local names {key!r}, which is not a key of the "
                    f"state ({sorted(map(str, state))})", "INVALID_ARGUMENT")
        self._binding = NativeBinding(job, self.rank, self.world_size,
                                      self.socket, rpc_timeout, host_snapshot,
                                      device,
                                      restore_peer_wait=restore_peer_wait,
                                      rank_local=rank_local)
        self._binding.sync(self._flatten())

    # --- the public API ---------------------------------------------------

    def save_async(self, step):
        """Starts saving the state as `step`; returns a handle with
        wait_staged() (after it the state may be mutated) and
        wait_committed(tier="disk", timeout=600)."""
        return self._binding.sync(self._flatten()).save_async(int(step))

    def save(self, step):
        """save_async(step) and wait_staged(): returns once the state may be
        mutated again; the persist goes on in ckptd."""
        handle = self.save_async(step)
        handle.wait_staged()
        return handle

    def last_save_error(self):
        """The exception of the most recent save that failed since the last
        call (a failed persist or commit), or None."""
        return self._native().last_save_error()

    def latest_committed(self, tier="disk"):
        """The newest step of the job committed at `tier`, or None."""
        return self._native().latest_committed(tier)

    def list_committed(self, tier="disk"):
        return self._native().list_committed(tier)

    def suspect_steps(self):
        """The job's committed steps whose replicas disagree (silent data
        corruption suspected; never resumed from by default): a list of
        {"step", "checked_by", "mismatches": [{"item", "majority_ranks",
        "minority_ranks", "minority_nodes"}]}."""
        return self._native().suspect_steps()

    def restore(self, step=None, tier="disk", strict=True):
        """Loads step `step` (default: the latest committed at `tier`; right
        after rejoin(), the epoch's resume_step) into the
        state in place and returns it; returns None when the job has no
        committed step. Tensors (also DTensors' local shards, and the tensors
        of nested state dicts such as get_state_dict's) are filled in place;
        a tensor saved with another global shape or dtype is an error that
        names it. With `strict`, the state and the checkpoint must have the
        same keys and tensors, as load_state_dict(strict=True) wants."""
        resume, self._resume = self._resume, None
        if step is None and resume is not None:
            step = resume["resume_step"]
            if step is None:
                return None
        elif step is None:
            step = self.latest_committed(tier)
            if step is None:
                return None
        step = int(step)
        meta = self._read_meta(step)
        self._check_keys(meta, step, strict)
        for key, skel in meta["optimizers"].items():
            if key in self.state and not _state.load_in_place(
                    self.state[key], skel):
                self.state[key].load_state_dict(
                    _state.materialize(key, skel, self.state[key]))
        layout = self._flatten()
        self._check_tensors(meta, layout, step, strict)
        native = self._binding.sync(layout, reshaped_ok=True)
        native.restore(step)
        for name in layout.bytes:
            if name == _RNG:
                _state.set_rng_state(self._loads(native, step, name))
            elif name.startswith(_EXTRA):
                key = name[len(_EXTRA):]
                self._load_extra(key, self._loads(native, step, name))
        for key, skel in meta.get("nested", {}).items():
            if key in self.state:
                self.state[key] = _state.merge(self.state[key], skel)
        return step

    def on_failure(self, callback):
        """Calls `callback(lost_nodes)` from a watcher thread when nodes of
        the job's cluster fail (their ckptd's etcd lease expired). Failures
        are also polled with lost_nodes()."""
        self._binding.failure_callback = callback
        self._native().watch_failures(callback)

    def lost_nodes(self):
        native = self._binding.native
        return native.lost_nodes() if native is not None else []

    def rejoin(self, min_ranks, max_ranks, participant=None, settle=2.0,
               timeout=300.0, tier="peer"):
        """Elastic restart without restarting the process: joins the job's
        next epoch, takes the rank and world size it assigns, and returns the
        epoch (a dict with epoch, rank, world_size, members, nccl_unique_id and
        resume_step: the newest step committed at `tier` when the epoch
        closed, the same for every member). Call restore() next: without a
        step it restores resume_step (None: nothing to resume from), and it
        reshards when the world size changed."""
        epoch = _ckpt.rejoin(self.job, min_ranks, max_ranks, participant or "",
                             self.socket, settle, timeout, tier)
        self._resume = epoch
        self.rank, self.world_size = epoch["rank"], epoch["world_size"]
        self._binding.forget()
        self._binding.rank, self._binding.world_size = self.rank, self.world_size
        self._binding.sync(self._flatten())
        return epoch

    def reset(self):
        """Accepts tensors whose shape or dtype changed since they were
        registered (the next save registers the state afresh)."""
        self._binding.forget()

    def stats(self):
        return self._native().stats()

    def close(self):
        """Waits for the copy in flight and disconnects; the daemon finishes
        persisting and committing what was staged."""
        self._binding.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # --- internals --------------------------------------------------------

    def _native(self):
        if self._binding.native is None:
            self._binding.sync(self._flatten())
        return self._binding.native

    def _flatten(self):
        """The items of the state as they are now."""
        layout = _state.Layout()
        kinds, optimizers, nested = {}, {}, {}
        for key, value in self.state.items():
            if not isinstance(key, str) or not key or "/" in key:
                raise errors.InvalidArgumentError(
                    f"state key {key!r}: keys must be non-empty strings "
                    f"without '/'", "INVALID_ARGUMENT")
            kind = kinds[key] = _state.kind(value)
            if kind == "tensor":
                layout.add(key, value)
            elif kind == "sharded":
                layout.add_box(key, value.tensor, value.global_shape,
                               value.offset)
            elif kind == "module":
                for name, tensor in value.state_dict().items():
                    layout.add(f"{key}/{name}", tensor)
            elif kind == "optimizer":
                optimizers[key] = _state.optimizer_skeleton(
                    key, value.state_dict(), layout)
            elif kind == "nested":
                nested[key] = _state.skeleton(key, value, layout)
            elif kind == "stateful":
                layout.bytes[_EXTRA + key] = _state.pickled(
                    key, value.state_dict())
            elif kind == "generator":
                layout.bytes[_EXTRA + key] = pickle.dumps(value.get_state())
            elif kind == "get_state":
                layout.bytes[_EXTRA + key] = _state.pickled(
                    key, value.get_state())
            elif kind == "sampler":
                layout.bytes[_EXTRA + key] = pickle.dumps(
                    _state.sampler_state(value))
            else:
                layout.bytes[_EXTRA + key] = _state.pickled(key, value)
        if self.rng:
            layout.bytes[_RNG] = pickle.dumps(_state.rng_state())
        layout.bytes[_META] = pickle.dumps({
            "version": _FORMAT_VERSION,
            "kinds": kinds,
            "optimizers": optimizers,
            "nested": nested,
            "tensors": {
                name: (_state.DTYPES[t.dtype], g)
                for name, (t, g, _) in layout.tensors.items()
            },
        })
        return layout

    def _load_extra(self, key, value):
        target = self.state[key]
        kind = _state.kind(target)
        if kind == "stateful":
            target.load_state_dict(value)
        elif kind == "generator":
            target.set_state(value)
        elif kind == "get_state":
            target.set_state(value)
        elif kind == "sampler":
            _state.set_sampler_state(target, value)
        else:
            self.state[key] = value

    def _loads(self, native, step, name):
        return self._unpickle.loads(native.get_bytes(name),
                                    f"step {step} of job {self.job}, {name}")

    def _read_meta(self, step):
        meta = self._unpickle.loads(
            self._binding.read_bytes(step, [_META])[_META],
            f"step {step} of job {self.job}, {_META}")
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
                f"{sorted(saved)}, the state has {sorted(here)} (missing "
                f"here: {sorted(saved - here)}, not in the checkpoint: "
                f"{sorted(here - saved)}); pass strict=False to restore the "
                f"keys both have", "NOT_FOUND")
        for key in saved & here:
            kind = _state.kind(self.state[key])
            if kind != meta["kinds"][key]:
                raise errors.InvalidArgumentError(
                    f"state key {key!r} is a {kind} here but was saved as a "
                    f"{meta['kinds'][key]} in step {step}", "INVALID_ARGUMENT")

    def _check_tensors(self, meta, layout, step, strict):
        """Names the tensors that the state and the checkpoint disagree on:
        missing on either side (strict), or of another dtype or global shape.
        Tensors of keys the checkpoint lacks (strict=False) are dropped from
        `layout`: nothing is restored into them."""
        saved = meta["tensors"]
        if isinstance(saved, list):  # older steps: names only
            saved = {name: None for name in saved}
        missing = [n for n in saved if n not in layout.tensors]
        if missing and strict:
            raise errors.NotFoundError(
                f"step {step} of job {self.job} has tensors the state lacks: "
                f"{', '.join(sorted(missing)[:8])}"
                f"{' ...' if len(missing) > 8 else ''}", "NOT_FOUND")
        unexpected = [n for n in layout.tensors if n not in saved]
        if unexpected and strict:
            raise errors.NotFoundError(
                f"the state has tensors that step {step} of job {self.job} "
                f"lacks: {', '.join(sorted(unexpected)[:8])}; the checkpoint "
                f"holds {', '.join(sorted(saved)[:16])}", "NOT_FOUND")
        for name in unexpected:
            del layout.tensors[name]
        for name, (tensor, global_shape, _) in layout.tensors.items():
            if saved[name] is None:
                continue
            dtype, shape = saved[name]
            here = _state.DTYPES[tensor.dtype]
            if dtype != here or tuple(shape) != tuple(global_shape):
                raise errors.InvalidArgumentError(
                    f"tensor '{name}': step {step} holds {dtype} "
                    f"{list(shape)}, the state has {here} "
                    f"{list(global_shape)}", "INVALID_ARGUMENT")
