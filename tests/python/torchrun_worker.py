"""A rank of fsdp_worker's transformer under FSDP2, trained by torchrun with
restarts: every incarnation resumes from the newest step committed in ckptd's
memory tier (which outlives the trainer), and a rank SIGKILLs itself where the
kill plan says.

  torchrun_worker.py SOCKET JOB STEPS OUT_DIR PLAN

PLAN is JSON: a list of [restart, rank, step, where] with where one of
"before_save" (after the step's training), "during_copy" (right after
save_async, while the state is being copied) and "after_staged"; restart is
torchrun's TORCHELASTIC_RESTART_COUNT. The data of each step is drawn from the
rank's global torch RNG, so the RNG state must come back with a restore for
the run to match an uninterrupted one. After the last step, rank 0 writes
every parameter and optimizer tensor whole to OUT_DIR/final.pt and each rank
its RNG state to OUT_DIR/rng-RANK.pt."""

import datetime
import json
import os
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_state_dict,
                                                     set_state_dict)

import ckpt.torch
from fsdp_worker import build, full_tensors, train_on


def train_step(model, optim):
    train_on(model, optim, torch.randint(0, 37, (4, 9)))  # the global RNG


def init_process_group(restart):
    """gloo over torchrun's store, its keys prefixed by the restart: a new
    incarnation must not find the peer addresses of the one before (seen
    with PyTorch 2.15: ranks of a restart connecting to dead ranks' ports)."""
    store = dist.TCPStore(os.environ["MASTER_ADDR"],
                          int(os.environ["MASTER_PORT"]),
                          is_master=False,
                          timeout=datetime.timedelta(seconds=120))
    dist.init_process_group("gloo",
                            store=dist.PrefixStore(f"restart-{restart}", store),
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def main():
    socket, job, steps, out_dir, plan = sys.argv[1:6]
    steps = int(steps)
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    init_process_group(restart)
    rank = dist.get_rank()
    kills = {(s, w) for r, k, s, w in json.loads(plan) if r == restart and k == rank}

    def maybe_die(step, where):
        if (step, where) in kills:
            print(f"restart {restart} rank {rank}: SIGKILL at step {step} {where}",
                  flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    model, optim = build(dist.get_world_size())
    torch.manual_seed(99 + rank)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    ckp = ckpt.torch.Checkpointer(state, job=job, socket=socket)
    restored = ckp.restore(tier="memory")
    if restored is not None:
        set_state_dict(model, optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    print(f"restart {restart} rank {rank}: restored {restored}", flush=True)
    for step in range(0 if restored is None else restored + 1, steps):
        print(f"restart {restart} rank {rank}: step {step}", file=sys.stderr,
              flush=True)
        train_step(model, optim)
        maybe_die(step, "before_save")
        state["model"], state["optim"] = get_state_dict(model, optim)
        handle = ckp.save_async(step)
        maybe_die(step, "during_copy")
        handle.wait_staged()
        maybe_die(step, "after_staged")
    rng = torch.get_rng_state()
    tensors = full_tensors(model, optim)
    ckp.close()
    if rank == 0:
        torch.save(tensors, os.path.join(out_dir, "final.pt"))
    torch.save(rng, os.path.join(out_dir, f"rng-{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
