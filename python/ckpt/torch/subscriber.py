"""ckpt.torch.Subscriber: a rollout or inference engine's reader of the
versions a trainer publishes through ckptd (issue #37).

    sub = ckpt.torch.Subscriber("policy")
    seen = 0
    while True:
        seen = sub.wait_for_version(after=seen, timeout=600)
        sub.load_into(policy_model, prefix="model")   # the newest version

A trainer (or an operator: `ckpt publish JOB STEP --topic policy`) publishes:

    ckpt.torch.publish("policy", job="grpo", step=step, items=["model/*"],
                       cast="bf16")

A version is opened whole, and a reader never mixes two versions: ckptd
places a version only once every chunk of every file verified. Tensors are
mapped out of ckptd's memory without a copy (`named_tensors`, and what
`load_into` copies from): a view keeps its version open (pinned) until the
last tensor over it goes, even after ckptd moved on to newer versions.
"""

import warnings

import torch

from ckpt import _ckpt
from ckpt import errors
from ckpt.torch._state import TORCH_DTYPES, is_dtensor, local_box


def publish(topic, job, step, items=None, cast="", socket=""):
    """Publishes committed `step` of `job` as the next version of `topic`;
    returns its record (a dict: version, job, step, bytes, ...)."""
    return _ckpt.publish(job, int(step), topic, list(items or []), cast,
                         socket)


def subscribe(topic, socket=""):
    """Makes this node's ckptd a subscriber of `topic`: it fetches each new
    version from its peers as it is published (until ckptd stops; its
    --subscribe flag keeps it). False when it was one already."""
    return _ckpt.subscribe(topic, socket)


class Subscriber:

    def __init__(self, topic, socket=""):
        self.topic = topic
        self._native = _ckpt.Subscriber(topic, socket=socket)

    def wait_for_version(self, after=0, timeout=600.0):
        """The newest version above `after`, once there is one (its number);
        DeadlineExceededError after `timeout` seconds."""
        return self._native.wait_for_version(int(after), float(timeout))["version"]

    def open(self, version=0):
        """The version (0: the newest) as a Version: its items readable while
        it is referenced, even after ckptd moved on to newer ones."""
        return Version(self._native.open(int(version)))

    def named_tensors(self, version=0):
        """(name, tensor) of every tensor of the version, each whole (its
        global shape) on the CPU: views over ckptd's memory, the version
        pinned while any of them lives (a tensor that cannot be mapped, split
        over ranks or stored small, is read into memory of its own). Writes
        to a view stay in this process."""
        opened = self.open(version)
        for item in opened.items:
            if item["tensor"]:
                yield item["name"], opened.tensor(item["name"])

    def load_into(self, module, version=0, prefix="model", strict=True):
        """Copies the version's items `prefix`/NAME into `module`'s
        state_dict entries NAME, in the module's own layout: plain tensors
        whole, DTensors their local shard (however they are sharded), cast to
        the module's dtypes and devices. Returns the version loaded. With
        `strict`, a state_dict entry the version lacks, or whose shape
        differs, is an error."""
        opened = self.open(version)
        names = {item["name"] for item in opened.items}
        with torch.no_grad():
            for name, target in module.state_dict().items():
                item = f"{prefix}/{name}" if prefix else name
                if item not in names:
                    if strict:
                        raise errors.NotFoundError(
                            f"version {opened.version} of topic {self.topic} "
                            f"has no item '{item}' for '{name}'", "NOT_FOUND")
                    continue
                if opened.read_into_plain(item, target):
                    continue
                whole = opened.tensor(item)
                if tuple(whole.shape) != tuple(target.shape):
                    raise errors.InvalidArgumentError(
                        f"item '{item}' has shape {tuple(whole.shape)}, "
                        f"'{name}' {tuple(target.shape)}", "INVALID_ARGUMENT")
                local, _, offset = local_box(name, target)
                if is_dtensor(target):
                    box = tuple(
                        slice(o, o + n) for o, n in zip(offset, local.shape))
                    local.copy_(whole[box])
                else:
                    target.copy_(whole)
        return opened.version


class Version:
    """An opened version: `items` (name, tensor, dtype, shape, bytes) and
    each tensor whole."""

    def __init__(self, native):
        self._native = native
        self.version = native.version
        self.items = native.items()
        self._by_name = {item["name"]: item for item in self.items}

    def record(self):
        return self._native.record()

    def read_into_plain(self, name, target):
        """Reads tensor `name` straight into `target` (one copy out of
        ckptd's memory) when it is a plain contiguous CPU tensor of the
        item's dtype and shape; False otherwise."""
        item = self._by_name.get(name)
        if (item is None or not item["tensor"] or is_dtensor(target)
                or target.device.type != "cpu" or not target.is_contiguous()
                or target.dtype != TORCH_DTYPES[item["dtype"]]
                or tuple(target.shape) != tuple(item["shape"])):
            return False
        self._native.read_into(name, target.data_ptr(), item["bytes"])
        return True

    def tensor(self, name):
        """Item `name`, whole, as a CPU tensor of its dtype: a view over
        ckptd's memory when it can be mapped (the version stays open while
        the view lives), else read into a tensor of its own."""
        item = self._by_name.get(name)
        if item is None or not item["tensor"]:
            raise errors.NotFoundError(
                f"version {self.version} has no tensor '{name}'", "NOT_FOUND")
        dtype = TORCH_DTYPES[item["dtype"]]
        view = self._native.view(name) if item["bytes"] > 0 else None
        if view is not None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a private mapping: writable
                return torch.frombuffer(view, dtype=dtype).view(item["shape"])
        out = torch.empty(item["shape"], dtype=dtype)
        self._native.read_into(name, out.data_ptr(), item["bytes"])
        return out
