"""ckpt.torch: checkpoint a PyTorch training state through the node's ckptd.

    import ckpt.torch
    state = {"model": model, "optim": optimizer, "progress": {"epoch": 0}}
    ckp = ckpt.torch.Checkpointer(state, job="mlp")
    start = (ckp.restore() or -1) + 1       # latest committed step, in place
    for step in range(start, steps):
        ...forward, backward...
        optimizer.step()
        ckp.save_async(step).wait_staged()  # then the state may change again

`state` maps names to
  - tensors (saved whole on every rank: data-parallel replicas) and DTensors
    (each rank saves its local shard at its place in the global tensor),
  - `Sharded(tensor, global_shape, offset)`: this rank's box of a global
    tensor, so that a restore onto another world size reshards it,
  - `torch.nn.Module`s (their state_dict: parameters and persistent buffers,
    as PyTorch saves them; FSDP2's are DTensors),
  - `torch.optim.Optimizer`s (state tensors and param groups),
  - nested dicts and lists holding tensors, such as the model and optimizer
    state dicts of torch.distributed.checkpoint.state_dict.get_state_dict
    (restored in place: pass them to set_state_dict afterwards),
  - objects with state_dict()/load_state_dict() (LR schedulers, GradScaler),
    torch.Generators and objects with get_state()/set_state(), samplers with
    set_epoch() (their epoch, seed and generator),
  - any other picklable value (restored by replacing `state[name]`).
Tensors are registered zero-copy by their data pointer: a save copies them
straight into ckptd's staging memory, in the background until `wait_staged()`.
The RNG states of torch, numpy and Python's random module are saved with each
step and restored with it (rng=False turns that off).

Rank and world size default to torchrun's RANK and WORLD_SIZE. Errors are the
exceptions of ckpt.errors, carrying ckptd's message. ckpt.torch.dcp holds a
storage backend for torch.distributed.checkpoint (PyTorch 2.x).
ckpt.torch.publish and ckpt.torch.Subscriber publish committed steps to
rollout and inference engines and read them (docs/publish.md).
"""

from ckpt.torch._state import Sharded, TensorRef
from ckpt.torch.checkpointer import Checkpointer
from ckpt.torch.subscriber import Subscriber, publish, subscribe

_TensorRef = TensorRef  # skeletons pickled by earlier releases name it here

__all__ = ["Checkpointer", "Sharded", "Subscriber", "publish", "subscribe"]
