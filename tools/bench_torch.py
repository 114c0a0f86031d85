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
slowdown.

With PyTorch 2.4 or newer (ckpt-bench runs build/torch-venv's when it is
there), the same state is also saved with torch.distributed.checkpoint's
async_save, once with DCP's own file-system writer (its default stager copies
the state into fresh CPU memory; the writer writes files in a background
thread) and once with ckpt's CkptStorageWriter (which stages straight into
ckptd's slot), and loaded back with dcp.load and with ckpt's restore:
`stall_vs_dcp_async`, `save_cost_vs_dcp_async`,
`dcp_writer_stall_vs_dcp_async` and `restore_vs_dcp_load` are time ratios
against DCP measured in the same run (below 1: ckpt is faster)."""

import argparse
import json
import os
import shutil
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


def dcp_available():
    try:
        import torch.distributed.checkpoint as dcp
        return hasattr(dcp, "async_save") and hasattr(dcp, "load")
    except ImportError:
        return False


def bench_dcp(args, model, optim, train_step, ckp):
    """DCP's async_save (file-system writer, and ckpt's writer) and dcp.load
    against ckpt.torch on the same state; returns the result's DCP fields."""
    import torch.distributed.checkpoint as dcp
    from ckpt.torch.dcp import CkptStorageWriter

    def state_dict():
        return {"model": model.state_dict(), "optim": optim.state_dict()}

    def async_runs(make_writer):
        stalls, costs, totals = [], [], []
        for run in range(args.runs + 1):
            start = time.perf_counter()
            future = dcp.async_save(state_dict(), storage_writer=make_writer(run))
            stall = time.perf_counter() - start
            after = timed(train_step)
            future.result()
            if run > 0:  # the first run allocates and registers
                stalls.append(stall)
                costs.append(after)
                totals.append(time.perf_counter() - start)
        return (statistics.median(stalls), statistics.median(costs),
                statistics.median(totals))

    root = os.path.join(args.dir, "bench-dcp")
    fs = async_runs(lambda run: dcp.FileSystemWriter(f"{root}/{run}"))
    writer = async_runs(lambda run: CkptStorageWriter(
        "bench-dcp", step=run, socket=args.socket, rank=0, world_size=1))
    loads = []
    for _ in range(args.runs):
        target = state_dict()
        loads.append(timed(lambda: dcp.load(
            target, storage_reader=dcp.FileSystemReader(f"{root}/{args.runs}"))))
    shutil.rmtree(root, ignore_errors=True)
    restores = [timed(lambda: ckp.restore(ckp.latest_committed("disk")))
                for _ in range(args.runs)]
    return fs, writer, statistics.median(loads), statistics.median(restores)


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
    dcp_figures = (bench_dcp(args, model, optim, train_step, ckp)
                   if dcp_available() else None)
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
    result["torch_version"] = torch.__version__
    if dcp_figures is not None:
        (fs_stall, fs_step, fs_total), (w_stall, w_step, w_total), load_s, \
            restore_s = dcp_figures
        plain_step = statistics.median(plain_steps)
        fs_cost = fs_stall + max(0.0, fs_step - plain_step)
        result.update({
            "dcp_async_stall_s": round(fs_stall, 4),
            "dcp_async_save_cost_s": round(fs_cost, 4),
            "dcp_async_total_s": round(fs_total, 4),
            "dcp_ckpt_writer_stall_s": round(w_stall, 4),
            "dcp_ckpt_writer_total_s": round(w_total, 4),
            "dcp_load_s": round(load_s, 4),
            "ckpt_restore_s": round(restore_s, 4),
            "stall_vs_dcp_async": round(stall / fs_stall, 4),
            "save_cost_vs_dcp_async": round(cost / fs_cost, 4),
            "dcp_writer_stall_vs_dcp_async": round(w_stall / fs_stall, 4),
            "restore_vs_dcp_load": round(restore_s / load_s, 4),
        })
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:28} {value}")


if __name__ == "__main__":
    main()
