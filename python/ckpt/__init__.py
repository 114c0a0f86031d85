"""ckpt: fault-tolerant, elastic checkpointing through the node's ckptd.

`ckpt.Checkpointer` is libckpt's Checkpointer (register tensors by address and
byte items, save_async, restore); `ckpt.torch.Checkpointer` checkpoints a
PyTorch state dict (tensors, modules, optimizers, RNG states, extras) with it.
Errors are the exceptions of `ckpt.errors`."""

from ckpt.errors import *  # noqa: F401,F403
from ckpt.errors import __all__ as _error_names
from ckpt._ckpt import Checkpointer, SaveHandle, default_socket, dtypes, rejoin

__all__ = ["Checkpointer", "SaveHandle", "default_socket", "dtypes", "rejoin"] + list(
    _error_names)
