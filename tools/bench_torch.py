"""ckpt-bench torch: the stall of ckpt.torch's save_async + wait_staged for a
model's full training state (parameters and Adam state), against torch.save
of the same state dict to the same disk, measured in the same run.

Run through `ckpt-bench torch`, which starts the benchmark's ckptd and sets
PYTHONPATH; the reference is torch.save into the ckptd data directory's file
system, without and with fsync."""

import argparse
import json
import os
import statistics
import time

import torch

import ckpt.torch


def build(state_mib):
    """An MLP whose parameters are a third of `state_mib` (Adam keeps two
    more tensors per parameter), after one step so that Adam's state
    exists."""
    torch.manual_seed(0)
    width = 2048
    layer_mib = width * width * 4 / (1 << 20)
    layers = max(1, round(state_mib / 3 / layer_mib))
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=True) for _ in range(layers)])
    optim = torch.optim.Adam(model.parameters(), lr=1e-4)
    model(torch.randn(4, width)).square().mean().backward()
    optim.step()
    return model, optim


def state_bytes(model, optim):
    n = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    for per_param in optim.state_dict()["state"].values():
        n += sum(t.numel() * t.element_size() for t in per_param.values()
                 if isinstance(t, torch.Tensor))
    return n


def torch_save(state, path, fsync):
    start = time.perf_counter()
    with open(path, "wb") as f:
        torch.save(state, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())
    seconds = time.perf_counter() - start
    os.unlink(path)
    return seconds


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--socket", required=True)
    p.add_argument("--dir", required=True, help="a directory on the disk")
    p.add_argument("--state-mib", type=int, default=768)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    model, optim = build(args.state_mib)
    total = state_bytes(model, optim)
    state = {"model": model, "optim": optim}
    ckp = ckpt.torch.Checkpointer(state, job="bench-torch", socket=args.socket,
                                  rank=0, world_size=1)
    # The first save maps (and on a GPU pins) its staging slot; the steady
    # state is what a training loop sees.
    ckp.save(0).wait_committed("disk", 600)
    stalls, persists = [], []
    for step in range(1, args.runs + 1):
        start = time.perf_counter()
        handle = ckp.save_async(step)
        handle.wait_staged()
        stalls.append(time.perf_counter() - start)
        handle.wait_committed("disk", 600)
        persists.append(time.perf_counter() - start)
    ckp.close()

    reference = {"model": model.state_dict(), "optim": optim.state_dict()}
    path = os.path.join(args.dir, "bench-torch-save.pt")
    plain = [torch_save(reference, path, False) for _ in range(args.runs)]
    synced = [torch_save(reference, path, True) for _ in range(args.runs)]

    stall = statistics.median(stalls)
    result = {
        "benchmark": "torch",
        "state_mib": round(total / (1 << 20), 1),
        "runs": args.runs,
        "stall_s": round(stall, 4),
        "torch_save_s": round(statistics.median(plain), 4),
        "torch_save_fsync_s": round(statistics.median(synced), 4),
        "stall_vs_torch_save": round(stall / statistics.median(plain), 4),
        "stall_vs_torch_save_fsync": round(stall / statistics.median(synced),
                                           4),
        "save_to_disk_commit_s": round(statistics.median(persists), 4),
        "stalls_s": [round(s, 4) for s in stalls],
        "torch_saves_s": [round(s, 4) for s in plain],
    }
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
