"""ckpt-bench publish's Python half, run by `ckpt-bench publish` (which sets
PYTHONPATH and gives the source ckptd's socket):

- gloo_broadcast_s: torch.distributed.broadcast of --bytes (bf16) from rank 0
  to the others among --world processes with the gloo backend on loopback,
  from a barrier to the last rank done (the median of --runs);
- load_into_s: ckpt.torch.Subscriber(--topic).load_into of the newest version
  (item model/w) into a module whose parameter `w` is that tensor, on the
  source node; memcpy_s: a copy of the same bytes between two tensors.

Writes one JSON object to --out."""

import argparse
import json
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ckpt.torch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broadcast_rank(rank, world, port, nbytes, runs, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    tensor = torch.empty(nbytes // 2, dtype=torch.bfloat16)
    if rank == 0:
        tensor.fill_(1.5)
    times = []
    for _ in range(runs):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(tensor, src=0)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        times.append(took.item())
    if rank == world - 1:
        assert float(tensor[0]) == 1.5 and float(tensor[-1]) == 1.5
    if rank == 0:
        results.put(statistics.median(times))
    dist.destroy_process_group()


def gloo_broadcast(nbytes, world, runs):
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    procs = [context.Process(target=broadcast_rank,
                             args=(r, world, port, nbytes, runs, results))
             for r in range(world)]
    for p in procs:
        p.start()
    seconds = results.get(timeout=600)
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"a gloo rank exited {p.exitcode}")
    return seconds


class Weights(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.w = torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16),
                                    requires_grad=False)


def load_into(sock, topic, nbytes, runs):
    sub = ckpt.torch.Subscriber(topic, socket=sock)
    module = Weights(nbytes // 2)
    loads, copies = [], []
    src = torch.ones(nbytes // 2, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    dst.copy_(src)  # pages faulted in, as the module's are after a load
    sub.load_into(module)
    opens, views = [], []
    for _ in range(runs):
        start = time.perf_counter()
        sub.load_into(module)
        loads.append(time.perf_counter() - start)
        start = time.perf_counter()
        dst.copy_(src)
        copies.append(time.perf_counter() - start)
        # Where load_into's time goes: opening, mapping.
        start = time.perf_counter()
        opened = sub.open()
        opens.append(time.perf_counter() - start)
        start = time.perf_counter()
        opened.tensor("model/w")
        views.append(time.perf_counter() - start)
    return (statistics.median(loads), statistics.median(copies),
            statistics.median(opens), statistics.median(views))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--bytes", type=int, required=True)
    parser.add_argument("--world", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    load_s, memcpy_s, open_s, view_s = load_into(
        args.socket, args.topic, args.bytes, max(args.runs, 3))
    out = {
        "gloo_broadcast_s": gloo_broadcast(args.bytes, args.world, args.runs),
        "load_into_s": load_s,
        "memcpy_s": memcpy_s,
        "load_into_open_s": open_s,
        "load_into_view_s": view_s,
        "torch": torch.__version__,
    }
    with open(args.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
