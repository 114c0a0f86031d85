"""Bitwise comparison of the final states train_mlp.py writes."""

import torch


def differences(a, b, path="state"):
    """The paths where `a` and `b` differ (tensors bit for bit: same dtype,
    shape and bytes; NaN equal to NaN of the same bits)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: tensor vs {type(b).__name__}"]
        if a.dtype != b.dtype or a.shape != b.shape:
            return [f"{path}: {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}"]
        if a.reshape(-1).view(torch.uint8).tolist() != b.reshape(-1).view(torch.uint8).tolist():
            return [f"{path}: values differ"]
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return [f"{path}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"]
        out = []
        for k in a:
            out += differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [f"{path}: length {len(a)} vs {len(b)}"]
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def load(path):
    return torch.load(path)
