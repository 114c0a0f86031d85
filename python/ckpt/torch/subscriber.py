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

A version is opened whole: every byte read is checked, and a reader never
mixes two versions.
"""

import torch

from ckpt import _ckpt
from ckpt import errors
from ckpt.torch._state import TORCH_DTYPES, is_dtensor, local_box


def publish(topic, job, step, items=None, cast="", socket=""):
    """Publishes committed `step` of `job` as the next version of `topic`;
    returns its record (a dict: version, job, step, bytes, ...)."""
    return _ckpt.publish(job, int(step), topic, list(items or []), cast,
                         socket)


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
        global shape) on the CPU."""
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
                if opened.read_in_place(item, target):
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

    def read_in_place(self, name, target):
        """Reads tensor `name` straight into `target` when it is a plain,
        contiguous CPU tensor of the item's dtype and shape (one copy, out of
        the version's files); False otherwise."""
        item = self._by_name.get(name)
        if (item is None or not item["tensor"] or is_dtensor(target)
                or target.device.type != "cpu" or not target.is_contiguous()
                or target.dtype != TORCH_DTYPES[item["dtype"]]
                or tuple(target.shape) != tuple(item["shape"])):
            return False
        self._native.read_into(name, target.data_ptr(), item["bytes"])
        return True

    def tensor(self, name):
        """Item `name`, whole, as a CPU tensor of its dtype."""
        item = self._by_name.get(name)
        if item is None or not item["tensor"]:
            raise errors.NotFoundError(
                f"version {self.version} has no tensor '{name}'", "NOT_FOUND")
        out = torch.empty(item["shape"], dtype=TORCH_DTYPES[item["dtype"]])
        self._native.read_into(name, out.data_ptr(), item["bytes"])
        return out
