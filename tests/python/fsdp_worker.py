"""A rank of a small transformer trained under FSDP2 (fully_shard) with the
gloo backend on CPU, run by torchrun; checkpoints through ckpt.torch.

  fsdp_worker.py train SOCKET JOB STEPS REF    saves every step, asynchronously;
                                               writes the full tensors after the
                                               last step to REF (rank 0)
  fsdp_worker.py restore SOCKET JOB STEP OUT   onto this world size: restores
                                               STEP, writes the full tensors
  fsdp_worker.py dcp-save SOCKET JOB STEPS REF the same through dcp.async_save
  fsdp_worker.py dcp-save-sync ...             ... and through dcp.save
  fsdp_worker.py dcp-load SOCKET JOB STEP OUT  ... and dcp.load
Model and data are seeded: every world size builds the same initial model."""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ckpt.torch


class Block(torch.nn.Module):

    def __init__(self, dim):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, 2, batch_first=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 3 * dim),
                                       torch.nn.GELU(),
                                       torch.nn.Linear(3 * dim, dim))

    def forward(self, x):
        h = self.norm(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(x)


class Model(torch.nn.Module):

    def __init__(self, vocab=37, dim=22, layers=2):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build(world):
    torch.manual_seed(1234)
    model = Model()
    mesh = init_device_mesh("cpu", (world, ))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, optim


def train_step(model, optim, step):
    g = torch.Generator().manual_seed(100 + step * 7 + dist.get_rank())
    train_on(model, optim, torch.randint(0, 37, (4, 9), generator=g))


def train_on(model, optim, tokens):
    """One step of next-token prediction on `tokens` (a batch of sequences)."""
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 37),
                                             tokens[:, 1:].reshape(-1))
    loss.backward()
    optim.step()
    optim.zero_grad()


def full_tensors(model, optim):
    """Every parameter and optimizer state tensor, gathered whole."""
    msd, osd = get_state_dict(model, optim)
    out = {f"model.{k}": v.full_tensor() for k, v in msd.items()}
    for fqn, per_param in osd["state"].items():
        for field, v in per_param.items():
            out[f"optim.{fqn}.{field}"] = (v.full_tensor() if hasattr(
                v, "full_tensor") else v.clone())
    return out


def progress(what):
    print(f"rank {os.environ.get('RANK')}: {what}", file=sys.stderr, flush=True)


def main():
    mode, socket, job, n, path = sys.argv[1:6]
    n = int(n)
    dist.init_process_group("gloo")
    world = dist.get_world_size()
    model, optim = build(world)
    if mode in ("train", "dcp-save", "dcp-save-sync"):
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        ckp = None
        if mode == "train":
            ckp = ckpt.torch.Checkpointer(state, job=job, socket=socket,
                                          rng=False)
        handle = None
        for step in range(n):
            train_step(model, optim, step)
            state["model"], state["optim"] = get_state_dict(model, optim)
            if mode == "train":
                handle = ckp.save_async(step)
                handle.wait_staged()
            elif mode == "dcp-save-sync":
                import torch.distributed.checkpoint as dcp
                from ckpt.torch.dcp import CkptStorageWriter
                dcp.save(state,
                         storage_writer=CkptStorageWriter(job, socket=socket),
                         checkpoint_id=f"ckpt://{job}/{step}")
            else:
                import torch.distributed.checkpoint as dcp
                from ckpt.torch.dcp import CkptStorageWriter
                handle = dcp.async_save(state,
                                        storage_writer=CkptStorageWriter(
                                            job, step=step, socket=socket))
                handle.result()
        if mode == "train":
            if handle is not None:
                handle.wait_committed("disk")
            ckp.close()
    else:
        msd, osd = get_state_dict(model, optim)
        state = {"model": msd, "optim": osd}
        if mode == "restore":
            ckp = ckpt.torch.Checkpointer(state, job=job, socket=socket,
                                          rng=False)
            assert ckp.restore(n) == n
            ckp.close()
        else:
            import torch.distributed.checkpoint as dcp
            from ckpt.torch.dcp import CkptStorageReader
            dcp.load(state,
                     storage_reader=CkptStorageReader(job, step=n,
                                                      socket=socket))
        progress(f"restored step {n}")
        set_state_dict(model, optim, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    tensors = full_tensors(model, optim)
    progress("gathered")
    if dist.get_rank() == 0:
        torch.save(tensors, path)
    dist.barrier()
    from ckpt.torch import dcp as ckpt_dcp
    ckpt_dcp.close()  # the DCP writers' shared bindings, before the group goes
    dist.destroy_process_group()
    progress("done")


if __name__ == "__main__":
    main()
    # Every result is saved and the group is gone: exit without the
    # interpreter's teardown, where torch's gloo threads once aborted a rank
    # ("terminate called without an active exception", stop 48's note).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
