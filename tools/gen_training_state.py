"""Real training state for `ckpt-bench codec`: a small transformer language
model trained for real (on CPU, a few hundred steps), saved as raw tensors at
consecutive save points, in three runs:

  dense_fp32  pre-training: weights, Adam moments and gradients, all float32;
  dense_bf16  the same snapshots with every tensor in bfloat16;
  frozen90    fine-tuning the trained model with about 90% of its parameters
              frozen: weights of every parameter, Adam moments and gradients of
              the trainable ones (what a trainer holds and saves);
  steps_fp32, steps_bf16, frozen90_steps
              the last pre-training steps saved one step apart (a trainer
              that saves every step), in float32 and in bfloat16, and the last
              fine-tuning steps so.

Each snapshot is one file of back-to-back raw tensors (row-major, little
endian); index.json lists, per run, the snapshots (step, file) and their
tensors (name, dtype, shape, offset, bytes). The data stays out of git:
    build/torch-venv/bin/python tools/gen_training_state.py --out build/bench-data
"""

import argparse
import json
import math
import os
import sys
import time

import torch
import torch.nn as nn

VOCAB = 512


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self, d, layers, heads, seq):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.randn(seq, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1))

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x, self.mask[: tokens.shape[1], : tokens.shape[1]])
        return self.head(self.ln(x))


def corpus(generator, batch, seq):
    """Token sequences from a fixed sparse Markov chain: learnable structure."""
    table = torch.randint(0, VOCAB, (VOCAB, 4), generator=torch.Generator().manual_seed(7))
    tokens = torch.empty(batch, seq + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (batch,), generator=generator)
    for t in range(seq):
        pick = torch.randint(0, 4, (batch,), generator=generator)
        tokens[:, t + 1] = table[tokens[:, t], pick]
    return tokens[:, :-1], tokens[:, 1:]


DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}


def snapshot(model, optim, dtype):
    """What a trainer saves: every parameter; Adam's moments and the gradient
    of each trainable one."""
    out = []
    for name, p in model.named_parameters():
        out.append(("model/" + name, p.detach()))
        if not p.requires_grad:
            continue
        st = optim.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in st:
                out.append((f"optim/{name}/{key}", st[key]))
        if p.grad is not None:
            out.append((f"grad/{name}", p.grad))
    return [(n, t.detach().to(dtype).contiguous()) for n, t in out]


def write(path, tensors):
    entries, offset = [], 0
    with open(path, "wb") as f:
        for name, t in tensors:
            raw = t.view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 \
                else t.numpy().tobytes()
            f.write(raw)
            entries.append({"name": name, "dtype": DTYPES[t.dtype], "shape": list(t.shape),
                            "offset": offset, "bytes": len(raw)})
            offset += len(raw)
    return entries


def train(model, optim, gen, steps, batch, seq, on_step):
    loss_fn = nn.CrossEntropyLoss()
    for step in range(1, steps + 1):
        x, y = corpus(gen, batch, seq)
        optim.zero_grad(set_to_none=False)
        loss = loss_fn(model(x).reshape(-1, VOCAB), y.reshape(-1))
        loss.backward()
        optim.step()
        on_step(step, loss.item())


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--pretrain-steps", type=int, default=300)
    p.add_argument("--finetune-steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--saves", type=int, default=10, help="snapshots kept per run")
    p.add_argument("--step-saves", type=int, default=10,
                   help="consecutive steps saved at the end of pre-training")
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(args.out, exist_ok=True)
    model = LM(args.d_model, args.layers, 4, args.seq)
    params = sum(p.numel() for p in model.parameters())
    print(f"model: {params / 1e6:.2f} M parameters", flush=True)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    index = {"model_parameters": params, "runs": {"dense_fp32": [], "dense_bf16": [],
                                                    "frozen90": [], "steps_fp32": [],
                                                    "steps_bf16": [], "frozen90_steps": []}}
    first_save = args.pretrain_steps - (args.saves - 1) * args.save_every
    start = time.time()

    def pretrain_step(step, loss):
        if step % 50 == 0:
            print(f"pretrain step {step} loss {loss:.3f} ({time.time() - start:.0f} s)",
                  flush=True)
        if step >= first_save and (step - first_save) % args.save_every == 0:
            for run, dtype in (("dense_fp32", torch.float32), ("dense_bf16", torch.bfloat16)):
                name = f"{run}-{step:06d}.bin"
                tensors = write(os.path.join(args.out, name), snapshot(model, optim, dtype))
                index["runs"][run].append({"step": step, "file": name, "tensors": tensors})
        if step > args.pretrain_steps - args.step_saves:
            for run, dtype in (("steps_fp32", torch.float32), ("steps_bf16", torch.bfloat16)):
                name = f"{run}-{step:06d}.bin"
                tensors = write(os.path.join(args.out, name), snapshot(model, optim, dtype))
                index["runs"][run].append({"step": step, "file": name, "tensors": tensors})

    train(model, optim, gen, args.pretrain_steps, args.batch, args.seq, pretrain_step)

    # Fine-tuning: freeze everything but the last block's MLP output layer, the
    # final norm and the head (about a tenth of the parameters), with a fresh
    # optimizer.
    trainable = set()
    for name, p in model.named_parameters():
        keep = name.startswith(f"blocks.{args.layers - 1}.mlp.2") or name.startswith("ln.") \
            or name.startswith("head")
        p.requires_grad_(keep)
        p.grad = None
        if keep:
            trainable.add(name)
    frozen = sum(p.numel() for n, p in model.named_parameters() if n not in trainable)
    print(f"fine-tuning: {100.0 * frozen / params:.1f}% of the parameters frozen", flush=True)
    optim = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    first_save = args.finetune_steps - (args.saves - 1) * args.save_every

    def finetune_step(step, loss):
        if step >= first_save and (step - first_save) % args.save_every == 0:
            name = f"frozen90-{step:06d}.bin"
            tensors = write(os.path.join(args.out, name),
                            snapshot(model, optim, torch.float32))
            index["runs"]["frozen90"].append({"step": step, "file": name, "tensors": tensors})
        if step > args.finetune_steps - args.step_saves:
            name = f"frozen90_steps-{step:06d}.bin"
            tensors = write(os.path.join(args.out, name),
                            snapshot(model, optim, torch.float32))
            index["runs"]["frozen90_steps"].append({"step": step, "file": name,
                                                    "tensors": tensors})

    train(model, optim, gen, args.finetune_steps, args.batch, args.seq, finetune_step)
    index["frozen_fraction"] = frozen / params
    with open(os.path.join(args.out, "index.json"), "w") as f:
        json.dump(index, f, indent=1)
    print(f"wrote {args.out}/index.json ({time.time() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
