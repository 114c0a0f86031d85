"""NativeBinding keeps one libckpt Checkpointer (ckpt._ckpt) registered with
what a Layout holds: the same tensors at the same addresses need nothing but
fresh byte items; tensors that moved or appeared are registered afresh (a new
native object); a tensor whose shape or dtype changed is an error unless the
caller accepts it."""

import torch

from ckpt import _ckpt
from ckpt import errors
from ckpt.torch._state import DTYPES


class NativeBinding:

    def __init__(self, job, rank, world_size, socket, rpc_timeout,
                 host_snapshot, device=None, read_only=False,
                 restore_peer_wait=60.0, rank_local=()):
        self.job, self.rank, self.world_size = job, rank, world_size
        self.socket, self.rpc_timeout = socket, rpc_timeout
        self.restore_peer_wait = restore_peer_wait
        self.host_snapshot, self.device = host_snapshot, device
        self.read_only = read_only  # restores never withdraw newer shards
        self.rank_local = tuple(rank_local)  # state keys never compared
        self.native = None
        self.failure_callback = None
        self._registered = None  # the signature the native object holds
        self._byte_names = set()

    def connect(self, device):
        """A fresh native Checkpointer with nothing registered."""
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
                                  host_snapshot=self.host_snapshot,
                                  read_only=self.read_only,
                                  restore_peer_wait=self.restore_peer_wait)

    def close(self):
        if self.native is not None:
            self.native.close()
            self.native = None

    def forget(self):
        """Accept any change of shape or dtype at the next sync."""
        self._registered = None
        self.close()

    def sync(self, layout, reshaped_ok=False):
        """Makes the native checkpointer hold `layout`'s items and sets the
        byte items' values; returns the native object."""
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
        if (self.native is None or signature != self._registered or
                set(layout.bytes) != self._byte_names):
            self.close()
            native = self.connect(self.device_for(layout))
            for name, (tensor, global_shape, offset) in layout.tensors.items():
                native.register_tensor(name,
                                       DTYPES[tensor.dtype],
                                       tensor.data_ptr(),
                                       list(global_shape),
                                       list(offset),
                                       list(tensor.shape),
                                       owner=tensor)
                if self._is_rank_local(name):
                    native.mark_rank_local(name)
            for name in layout.bytes:
                native.register_bytes(name)
            if self.failure_callback is not None:
                native.watch_failures(self.failure_callback)
            self.native, self._registered = native, signature
            self._byte_names = set(layout.bytes)
        for name, value in layout.bytes.items():
            self.native.set_bytes(name, value)
        return self.native

    def _is_rank_local(self, name):
        return any(name == key or name.startswith(key + "/")
                   for key in self.rank_local)

    def device_for(self, layout):
        if self.device is not None:
            return self.device
        devices = {t.device.type for t, _, _ in layout.tensors.values()}
        if devices == {"cuda"}:
            return "cuda"
        if devices - {"cpu"}:
            raise errors.InvalidArgumentError(
                f"the state's tensors are on {sorted(devices)}; one "
                f"checkpointer takes host tensors or tensors of one GPU",
                "INVALID_ARGUMENT")
        return "cpu"

    def read_bytes(self, step, names, rank=None):
        """The byte items `names` of `step` as saved by `rank` (default: this
        rank; a rank the step lacks reads saved rank 0's), through a read-only
        probe that registers nothing else."""
        rank = self.rank if rank is None else rank
        probe = _ckpt.Checkpointer(
            self.job,
            rank=rank,
            world_size=max(self.world_size, rank + 1),
            socket=self.socket,
            rpc_timeout=self.rpc_timeout,
            device="cpu",
            cuda_device=0,
            compute_stream=0,
            host_snapshot=self.host_snapshot,
            read_only=True)
        try:
            for name in names:
                probe.register_bytes(name)
            probe.restore(step)
            return {name: probe.get_bytes(name) for name in names}
        finally:
            probe.close()
