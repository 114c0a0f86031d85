"""What a ckpt.torch state holds, flattened into ckptd's items: tensors (each
this rank's box of a global tensor) and byte items (pickled values).

The kinds of value a state maps names to, the boxes of DTensors and Sharded
tensors, the skeletons that stand for optimizer state and nested state dicts
in a pickle (tensors replaced by _TensorRef), and the RNG states."""

import collections
import os
import pickle
import random

import torch

from ckpt import errors

try:
    import numpy
except ImportError:  # numpy's RNG is saved only when numpy is there
    numpy = None

try:  # PyTorch >= 2.4; older releases have no public DTensor
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import (
        compute_local_shape_and_global_offset)
except ImportError:
    DTensor = None

DTYPES = {
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
        DTYPES[getattr(torch, _attr)] = _name
TORCH_DTYPES = {name: dtype for dtype, name in DTYPES.items()}


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


class TensorRef:
    """Stands for a tensor in a pickled skeleton (optimizer state, nested
    state dicts): its item name, dtype and global shape, and whether it was a
    DTensor."""

    def __init__(self, name, dtype, shape, dtensor=False):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.dtensor = dtensor

    def __setstate__(self, state):  # skeletons pickled before `dtensor`
        self.__dict__.update(state)
        self.__dict__.setdefault("dtensor", False)


class Layout:
    """What one save registers: tensors (name -> (tensor, global shape,
    offset)) and byte items (name -> bytes)."""

    def __init__(self):
        self.tensors = {}
        self.bytes = {}

    def add(self, name, tensor):
        """Adds `tensor` (plain, DTensor) under `name`: its local box."""
        local, global_shape, offset = local_box(name, tensor)
        self.add_box(name, local, global_shape, offset)

    def add_box(self, name, tensor, global_shape, offset):
        check_tensor(name, tensor)
        if name in self.tensors:
            raise errors.InvalidArgumentError(
                f"two tensors of the state map to the item name '{name}'",
                "INVALID_ARGUMENT")
        self.tensors[name] = (tensor, tuple(global_shape), tuple(offset))

    def signature(self):
        return {
            name: (DTYPES.get(t.dtype), tuple(t.shape), g, o, t.data_ptr())
            for name, (t, g, o) in self.tensors.items()
        }


def is_dtensor(value):
    return DTensor is not None and isinstance(value, DTensor)


def local_box(name, tensor):
    """(local tensor, global shape, offset of the local box) of a plain tensor
    (the whole tensor) or a DTensor (its local shard, placed by its mesh)."""
    if not is_dtensor(tensor):
        return tensor, tuple(tensor.shape), (0, ) * tensor.dim()
    for placement in tensor.placements:
        if type(placement) not in (Shard, Replicate):
            raise errors.InvalidArgumentError(
                f"tensor '{name}': DTensor placement {placement} is not "
                f"supported; ckpt saves Shard and Replicate placements "
                f"(redistribute the tensor first)", "INVALID_ARGUMENT")
    local = tensor.to_local()
    _, offset = compute_local_shape_and_global_offset(tensor.shape,
                                                      tensor.device_mesh,
                                                      tensor.placements)
    return local, tuple(tensor.shape), tuple(int(o) for o in offset)


def check_tensor(name, tensor):
    if tensor.dtype not in DTYPES:
        raise errors.InvalidArgumentError(
            f"tensor '{name}': dtype {tensor.dtype} is not supported; "
            f"supported: {', '.join(str(d) for d in DTYPES)}",
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


def env_int(name, default):
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except ValueError:
        raise errors.InvalidArgumentError(
            f"environment variable {name}={value!r} is not an integer",
            "INVALID_ARGUMENT") from None


# --- kinds of value -------------------------------------------------------


def kind(value):
    """How a value of the state is saved (see Checkpointer's doc)."""
    if isinstance(value, torch.Tensor):
        return "tensor"
    if isinstance(value, Sharded):
        return "sharded"
    if isinstance(value, torch.nn.Module):
        return "module"
    if isinstance(value, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(value, torch.Generator):
        return "generator"
    if isinstance(value, (dict, list, tuple)) and _holds_tensor(value):
        return "nested"
    if callable(getattr(value, "state_dict", None)) and callable(
            getattr(value, "load_state_dict", None)):
        return "stateful"
    if callable(getattr(value, "get_state", None)) and callable(
            getattr(value, "set_state", None)):
        return "get_state"
    if callable(getattr(value, "set_epoch", None)) and hasattr(
            value, "epoch"):
        return "sampler"
    return "object"


def _holds_tensor(value):
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, dict):
        return any(_holds_tensor(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_holds_tensor(v) for v in value)
    return False


def sampler_state(sampler):
    """What a sampler carries: its epoch, seed and generator state."""
    state = {"epoch": sampler.epoch}
    if hasattr(sampler, "seed"):
        state["seed"] = sampler.seed
    generator = getattr(sampler, "generator", None)
    if isinstance(generator, torch.Generator):
        state["generator"] = generator.get_state()
    return state


def set_sampler_state(sampler, state):
    sampler.set_epoch(state["epoch"])
    if "seed" in state:
        sampler.seed = state["seed"]
    generator = getattr(sampler, "generator", None)
    if "generator" in state and isinstance(generator, torch.Generator):
        generator.set_state(state["generator"])


def pickled(key, value):
    try:
        return pickle.dumps(value)
    except Exception as e:
        raise errors.InvalidArgumentError(
            f"state key {key!r}: a {type(value).__name__} is neither a "
            f"tensor, module, optimizer, state dict nor picklable ({e})",
            "INVALID_ARGUMENT") from e


# --- skeletons: pickled structure with tensors by reference ---------------


def _component(key):
    return str(key).replace("%", "%25").replace("/", "%2F")


def skeleton(prefix, value, layout):
    """`value` (nested dicts, lists and tuples) with each tensor added to
    `layout` under prefix/key/... and replaced by a TensorRef."""
    if isinstance(value, torch.Tensor):
        layout.add(prefix, value)
        local = value.to_local() if is_dtensor(value) else value
        return TensorRef(prefix, DTYPES[local.dtype], value.shape,
                         is_dtensor(value))
    if isinstance(value, dict):
        out = (collections.OrderedDict()
               if isinstance(value, collections.OrderedDict) else {})
        for k, v in value.items():
            out[k] = skeleton(f"{prefix}/{_component(k)}", v, layout)
        return out
    if type(value) in (list, tuple):
        return type(value)(
            skeleton(f"{prefix}/{i}", v, layout) for i, v in enumerate(value))
    return value


def merge(current, saved):
    """The value that the restored state holds where `current` held a value
    and the checkpoint's skeleton `saved`: tensors stay (restored in place),
    dicts and lists are updated in place, other values are replaced."""
    if isinstance(saved, TensorRef):
        return current
    if isinstance(saved, dict) and isinstance(current, dict):
        for k, v in saved.items():
            current[k] = merge(current.get(k), v)
        return current
    if isinstance(saved, list) and isinstance(current, list) and len(
            saved) == len(current):
        for i, v in enumerate(saved):
            current[i] = merge(current[i], v)
        return current
    if isinstance(saved, tuple) and isinstance(current, tuple) and len(
            saved) == len(current):
        return tuple(merge(c, s) for c, s in zip(current, saved))
    return saved


def optimizer_skeleton(key, state_dict, layout):
    """An optimizer's state_dict with each state tensor added to `layout`."""
    return {
        "state": {
            index: skeleton(f"{key}/state/{index}", per_param, layout)
            for index, per_param in state_dict["state"].items()
        },
        "param_groups": state_dict["param_groups"],
    }


def load_in_place(optimizer, skel):
    """When the optimizer's state already has the saved tensors' dtypes and
    shapes, takes the saved param groups and non-tensor state into it and
    returns True: the restore then fills its tensors in place, with no new
    allocation. Else returns False and changes nothing."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = skel["param_groups"]
    if len(groups) != len(optimizer.param_groups) or any(
            len(g["params"]) != len(h["params"])
            for g, h in zip(groups, optimizer.param_groups)):
        return False
    if set(skel["state"]) != {
            i for i, p in enumerate(params) if p in optimizer.state
    }:
        return False
    updates = []
    for index, per_param in skel["state"].items():
        here = optimizer.state[params[index]]
        if set(here) != set(per_param):
            return False
        for field, value in per_param.items():
            if isinstance(value, TensorRef):
                tensor = here[field]
                if (not isinstance(tensor, torch.Tensor) or
                        DTYPES.get(tensor.dtype) != value.dtype or
                        tuple(tensor.shape) != value.shape or
                        is_dtensor(tensor) != value.dtensor):
                    return False
            else:
                updates.append((here, field, value))
    for here, field, value in updates:
        here[field] = value
    for group, saved in zip(optimizer.param_groups, groups):
        for k, v in saved.items():
            if k != "params":
                group[k] = v
    return True


def materialize(key, skel, optimizer):
    """An optimizer state_dict from a skeleton, with uninitialized tensors of
    the saved dtypes and shapes (the restore fills them). A DTensor's is made
    like its parameter, so that it is sharded the same way."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    state = {}
    for index, per_param in skel["state"].items():
        entry = {}
        for field, value in per_param.items():
            if not isinstance(value, TensorRef):
                entry[field] = value
                continue
            dtype = TORCH_DTYPES[value.dtype]
            if value.dtensor:
                param = params[index] if index < len(params) else None
                if param is None or tuple(param.shape) != value.shape:
                    raise errors.InvalidArgumentError(
                        f"optimizer '{key}': state '{value.name}' is a DTensor "
                        f"of shape {list(value.shape)}, but parameter {index} "
                        f"is {None if param is None else list(param.shape)}",
                        "INVALID_ARGUMENT")
                entry[field] = torch.empty_like(param, dtype=dtype)
            else:
                entry[field] = torch.empty(value.shape, dtype=dtype)
        state[index] = entry
    return {"state": state, "param_groups": skel["param_groups"]}


# --- RNG states -----------------------------------------------------------


def rng_state():
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


def set_rng_state(state):
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
