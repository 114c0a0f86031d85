"""ckpt-bench torch: the stall of ckpt.torch's save_async + wait_staged for a
model's full training state (parameters and Adam state), against torch.save
of the same state dict to the same disk, measured in the same run.

Run through `ckpt-bench torch`, which starts the benchmark's ckptd and sets
PYTHONPATH; the reference is torch.save into the ckptd data directory's file
system, without and with fsync.

A save may also cost the trainer after wait_staged: with fork snapshots
(--host-snapshot fork), the first write to each page after the fork
faults. So each save is followed by one timed training step (forward,
backward, Adam step: every parameter and Adam tensor is rewritten), compared
with training steps without a save; `save_cost_s` is the stall plus that
slowdown."""

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
    batch = torch.randn(4, width)

    def train_step():
        optim.zero_grad(set_to_none=False)
        model(batch).square().mean().backward()
        optim.step()

    train_step()
    return model, optim, train_step


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
    p.add_argument("--host-snapshot", default="copy",
                   choices=["copy", "fork"])
    p.add_argument("--huge-pages", action="store_true",
                   help="(reported only: set by ckpt-bench through "
                   "GLIBC_TUNABLES)")
    args = p.parse_args()

    model, optim, train_step = build(args.state_mib)
    total = state_bytes(model, optim)
    state = {"model": model, "optim": optim}
    ckp = ckpt.torch.Checkpointer(state, job="bench-torch", socket=args.socket,
                                  rank=0, world_size=1,
                                  host_snapshot=args.host_snapshot)
    # The first save maps (and on a GPU pins) its staging slot; the steady
    # state is what a training loop sees.
    ckp.save(0).wait_committed("disk", 600)
    plain_steps = [timed(train_step) for _ in range(args.runs + 1)][1:]
    stalls, persists, steps_after = [], [], []
    for step in range(1, args.runs + 1):
        start = time.perf_counter()
        handle = ckp.save_async(step)
        handle.wait_staged()
        stalls.append(time.perf_counter() - start)
        steps_after.append(timed(train_step))
        handle.wait_committed("disk", 600)
        persists.append(time.perf_counter() - start)
    stats = ckp.stats()
    ckp.close()

    reference = {"model": model.state_dict(), "optim": optim.state_dict()}
    path = os.path.join(args.dir, "bench-torch-save.pt")
    plain = [torch_save(reference, path, False) for _ in range(args.runs)]
    synced = [torch_save(reference, path, True) for _ in range(args.runs)]

    stall = statistics.median(stalls)
    slowdown = statistics.median(steps_after) - statistics.median(plain_steps)
    cost = stall + max(0.0, slowdown)
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
        "train_step_s": round(statistics.median(plain_steps), 4),
        "train_step_after_save_s": round(statistics.median(steps_after), 4),
        "save_cost_s": round(cost, 4),
        "save_cost_vs_torch_save": round(cost / statistics.median(plain), 4),
        "host_snapshot": args.host_snapshot,
        "huge_pages": args.huge_pages,
        "saves_forked": stats["saves_forked"],
        "fork_refused": stats["fork_refused"],
        "huge_page_share": round(stats["huge_page_share"], 3),
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
