"""A small real training job for the tests: an MLP with dropout and batch
norm, trained with Adam and a step LR schedule on generated data, checkpointed
with ckpt.torch every few steps. Deterministic: the data of step s depends
only on s, and dropout draws from torch's global RNG (which ckpt restores).

Prints "restored S" when it resumed from step S, "step S" after each step and
"done" at the end, then writes the final state (parameters, optimizer, LR
schedule, progress, RNG) with torch.save to --out.

Data-parallel replicas: every rank computes the full batch, so all ranks hold
the same state and a restore onto another world size must reproduce it."""

import argparse
import sys

import torch


def build(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.ReLU(),
        torch.nn.Dropout(0.2), torch.nn.Linear(64, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 4))
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=50, gamma=0.5)
    return model, optim, sched


def batch(step):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(64, 32, generator=g)
    y = torch.randint(0, 4, (64, ), generator=g)
    return x, y


def train_step(model, optim, sched, step):
    x, y = batch(step)
    optim.zero_grad(set_to_none=True)
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optim.step()
    sched.step()
    return loss.item()


def final_state(model, optim, sched, progress):
    return {
        "model": model.state_dict(),
        "optim": optim.state_dict(),
        "sched": sched.state_dict(),
        "progress": progress,
        "rng": torch.get_rng_state(),
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--job", default="mlp")
    p.add_argument("--socket", default=None)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--stop-at", type=int, default=None,
                   help="leave after this many steps (the job goes on later)")
    p.add_argument("--save-every", type=int, default=5)
    p.add_argument("--rank", type=int, default=None)
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--no-ckpt", action="store_true", help="the reference run")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    model, optim, sched = build()
    progress = {"step": -1, "loss_sum": 0.0}
    state = {"model": model, "optim": optim, "sched": sched, "progress": progress}
    ckp, start = None, 0
    if not args.no_ckpt:
        import ckpt.torch
        ckp = ckpt.torch.Checkpointer(state, job=args.job, socket=args.socket,
                                      rank=args.rank, world_size=args.world_size)
        restored = ckp.restore()
        if restored is not None:
            progress = state["progress"]
            assert progress["step"] == restored, (progress, restored)
            print(f"restored {restored}", flush=True)
            start = restored + 1
    end = args.steps if args.stop_at is None else min(args.stop_at, args.steps)
    handle = None
    for step in range(start, end):
        loss = train_step(model, optim, sched, step)
        progress["step"] = step
        progress["loss_sum"] += loss
        if ckp is not None and (step % args.save_every == 0 or step == end - 1):
            handle = ckp.save_async(step)
            handle.wait_staged()
        print(f"step {step}", flush=True)
    if handle is not None:
        handle.wait_committed("disk", 120)
    if ckp is not None:
        ckp.close()
    torch.save(final_state(model, optim, sched, progress), args.out)
    print("done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
