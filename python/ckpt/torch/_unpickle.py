"""Unpickling of checkpoint bytes that runs no code chosen by those bytes.

A pickle names the functions and classes it calls to rebuild its values;
pickle.loads imports and calls whatever it names (os.system included), so a
forged or altered checkpoint would run code in the trainer. Like
torch.load(weights_only=True), `loads` resolves only names on an allow-list:

  - Python's containers and scalars (dict, list, tuple, set, frozenset, int,
    float, complex, bool, str, bytes, bytearray, slice, range), the
    collections module's OrderedDict, defaultdict, deque and Counter, and
    getattr only as enum members are pickled (a member of an allowed Enum),
  - torch dtypes, layouts, memory formats, devices and sizes, and tensors
    (their storage read back with torch.load(weights_only=True)),
  - numpy arrays, dtypes and scalars (numpy's RNG state),
  - ckpt's own classes and the DCP metadata classes ckpt.torch.dcp saves,
  - what the caller trusts: `trusted` (classes or functions, or their
    "module.qualname") and torch.serialization's safe globals.

Anything else is refused by name with PermissionDeniedError. `unsafe=True`
(the caller's explicit choice for a checkpoint it trusts) unpickles
everything, as pickle.loads does."""

import builtins
import collections
import enum
import importlib
import io
import pickle

import torch

from ckpt import errors

_BUILTINS = ("dict", "list", "tuple", "set", "frozenset", "int", "float",
             "complex", "bool", "str", "bytes", "bytearray", "slice", "range")
_COLLECTIONS = ("OrderedDict", "defaultdict", "deque", "Counter")
_TORCH_VALUE_TYPES = (torch.dtype, torch.layout, torch.memory_format)
_TORCH_CALLABLES = {
    ("torch", "Size"): torch.Size,
    ("torch", "device"): torch.device,
    ("torch", "Tensor"): torch.Tensor,
    ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
    ("torch._utils", "_rebuild_tensor"): torch._utils._rebuild_tensor,
    ("torch._utils", "_rebuild_tensor_v2"): torch._utils._rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): torch._utils._rebuild_parameter,
}
_NUMPY = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "scalar"),
}
_CKPT = {
    ("ckpt.torch._state", "TensorRef"),
    ("ckpt.torch", "TensorRef"),
    ("ckpt.torch", "_TensorRef"),
}
_DCP_METADATA = ("TensorProperties", "_MEM_FORMAT_ENCODING",
                 "ChunkStorageMetadata", "BytesStorageMetadata",
                 "TensorStorageMetadata", "MetadataIndex", "StorageMeta")


def _load_storage(data):
    """torch.storage._load_from_bytes, as a pickled tensor's storage names
    it, but through torch's own weights-only unpickler."""
    return torch.load(io.BytesIO(data), weights_only=True)


def _enum_member(cls, name):
    """builtins.getattr as Python >= 3.11 pickles enum members
    (getattr(TheEnum, "NAME")): only a member of an Enum class that the
    allow-list let in, never any other attribute."""
    if isinstance(cls, type) and issubclass(cls, enum.Enum) and isinstance(
            name, str) and name in cls.__members__:
        return cls[name]
    raise errors.PermissionDeniedError(
        f"the pickle calls getattr({cls!r}, {name!r}); ckpt lets a pickle "
        f"getattr only a member of an Enum class", "PERMISSION_DENIED")


def _import(module, name):
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _numpy_dtype_class(module, name):
    """numpy 2's dtype classes (numpy.dtypes.Float64DType, ...)."""
    return module == "numpy.dtypes" and name.endswith("DType")


def _builtin_allowed(module, name):
    """The allow-list's object for (module, name), or None."""
    if module == "builtins" and name in _BUILTINS:
        return getattr(builtins, name)
    if (module, name) == ("builtins", "getattr"):
        return _enum_member
    if module == "collections" and name in _COLLECTIONS:
        return getattr(collections, name)
    if module == "torch":
        value = getattr(torch, name, None)
        if isinstance(value, _TORCH_VALUE_TYPES):
            return value
    if (module, name) in _TORCH_CALLABLES:
        return _TORCH_CALLABLES[(module, name)]
    if (module, name) == ("torch.storage", "_load_from_bytes"):
        return _load_storage
    if (module, name) == ("torch.serialization", "_get_layout"):
        # PyTorch >= 2.1 pickles layouts as _get_layout("torch.strided"): a
        # lookup among torch's layouts.
        return getattr(torch.serialization, "_get_layout", None)
    if ((module, name) in _NUMPY or (module, name) in _CKPT or
            _numpy_dtype_class(module, name) or
        (module == "torch.distributed.checkpoint.metadata" and
         name in _DCP_METADATA)):
        return _import(module, name)
    return None


def _torch_safe_globals():
    """What torch.serialization.add_safe_globals was given (PyTorch >= 2.4)."""
    get = getattr(torch.serialization, "get_safe_globals", None)
    if get is None:
        return []
    out = []
    for entry in get():
        out.append(entry[0] if isinstance(entry, tuple) else entry)
    return out


def _trusted_names(trusted):
    """(module, qualname) -> object for the caller's trusted globals."""
    names = {}
    for entry in list(trusted) + _torch_safe_globals():
        if isinstance(entry, str):
            module, _, name = entry.replace(":", ".").rpartition(".")
            if not module:
                raise errors.InvalidArgumentError(
                    f"trusted global {entry!r} is not 'module.name'",
                    "INVALID_ARGUMENT")
            names[(module, name)] = None  # resolved when a pickle names it
        else:
            names[(entry.__module__, entry.__qualname__)] = entry
    return names


class _Unpickler(pickle.Unpickler):

    def __init__(self, data, what, trusted):
        super().__init__(io.BytesIO(data))
        self._what = what
        self._trusted = trusted

    def find_class(self, module, name):
        allowed = _builtin_allowed(module, name)
        if allowed is not None:
            return allowed
        if (module, name) in self._trusted:
            return self._trusted[(module, name)] or _import(module, name)
        raise errors.PermissionDeniedError(
            f"{self._what}: the pickle names {module}.{name}, which ckpt does "
            f"not unpickle from checkpoint bytes (a pickle's names run code); "
            f"it unpickles Python's containers and scalars, torch dtypes, "
            f"sizes and tensors, numpy arrays and ckpt's own classes. If this "
            f"checkpoint is trusted, pass trusted_globals=['{module}.{name}'] "
            f"(or unsafe_pickle=True)", "PERMISSION_DENIED")

    def persistent_load(self, pid):
        raise errors.PermissionDeniedError(
            f"{self._what}: the pickle holds a persistent id ({pid!r}), which "
            f"ckpt never writes", "PERMISSION_DENIED")


class Policy:
    """How a restore unpickles: the allow-list plus `trusted_globals`, or
    everything when `unsafe_pickle`."""

    def __init__(self, trusted_globals=(), unsafe_pickle=False):
        self._trusted = _trusted_names(trusted_globals or ())
        self._unsafe = bool(unsafe_pickle)

    def check_torch_bytes(self, data, what):
        """Refuses torch.save bytes (DCP's serialization of non-tensor values,
        which DCP's planner torch.loads itself) that torch's weights-only
        unpickler refuses: what passes it names only allowed globals, so the
        planner's load runs nothing else."""
        if self._unsafe:
            return
        trusted = [obj for obj in self._trusted.values() if obj is not None]
        scope = getattr(torch.serialization, "safe_globals", None)
        try:
            if scope is None:
                torch.load(io.BytesIO(data), weights_only=True)
            else:
                with scope(trusted):
                    torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as e:
            raise errors.PermissionDeniedError(
                f"{what}: torch.load(weights_only=True) refuses it, so ckpt "
                f"does not let DCP unpickle it (pass trusted_globals or "
                f"unsafe_pickle=True if this checkpoint is trusted): {e}",
                "PERMISSION_DENIED") from e

    def loads(self, data, what):
        """The value pickled in `data`; `what` names the bytes in errors
        (e.g. "step 7 of job llm, item __ckpt__/meta")."""
        if self._unsafe:
            return pickle.loads(data)
        try:
            return _Unpickler(data, what, self._trusted).load()
        except errors.Error:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError,
                AttributeError, IndexError, KeyError, ImportError) as e:
            raise errors.DataLossError(
                f"{what}: not a valid pickle ({type(e).__name__}: {e})",
                "DATA_LOSS") from e
