"""ckpt.torch in one process over a real ckptd: what a state dict holds comes
back in place, and bad use raises a clear exception."""

import collections
import os
import pickle
import random
import tempfile
import time
import unittest

import numpy
import torch

import ckpt
import ckpt.torch
from ckpt.torch import _unpickle
from ckpt_testing import Daemon, DaemonTestCase
from torch_compare import differences


class RunsCode:
    """Pickles to a call of os.system: what a forged checkpoint would hold."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


class Config:
    """A user's class saved as a plain value."""

    def __init__(self, depth):
        self.depth = depth


def model_and_optimizer():
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                torch.nn.Linear(16, 2))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return model, optim


def train(model, optim, steps=3):
    for _ in range(steps):
        optim.zero_grad()
        model(torch.randn(4, 8)).square().mean().backward()
        optim.step()


def snapshot(model, optim):
    return {
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optim": {
            i: {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in s.items()}
            for i, s in optim.state_dict()["state"].items()
        },
        "groups": optim.state_dict()["param_groups"],
    }


class TorchCheckpointerTest(DaemonTestCase):

    def checkpointer(self, state, job, **kw):
        return ckpt.torch.Checkpointer(state, job=job, socket=self.daemon.socket, **kw)

    def test_state_comes_back_in_place_with_rng_and_extras(self):
        model, optim = model_and_optimizer()
        sched = torch.optim.lr_scheduler.StepLR(optim, step_size=2, gamma=0.1)
        extra = {"epoch": 3, "seen": [1, 2, 3]}
        state = {"model": model, "optim": optim, "sched": sched, "extra": extra,
                 "ema": torch.arange(6, dtype=torch.float64)}
        c = self.checkpointer(state, "torch-roundtrip")
        self.assertIsNone(c.restore())
        train(model, optim)
        sched.step()
        h = c.save_async(5)
        h.wait_staged()
        h.wait_committed("disk", 60)
        saved = snapshot(model, optim)
        saved_lr = optim.param_groups[0]["lr"]
        # Draws from the RNG states the save captured.
        expected_draws = (random.random(), numpy.random.rand(), torch.rand(3))

        # Everything moves on, then the restore brings step 5 back in place.
        ptr = model[0].weight.data_ptr()
        train(model, optim)
        sched.step()
        sched.step()
        state["extra"] = {"epoch": 9}
        state["ema"].add_(1)
        random.seed(7)
        numpy.random.seed(7)
        torch.manual_seed(7)
        self.assertEqual(c.latest_committed(), 5)
        self.assertEqual(c.restore(), 5)
        draws = (random.random(), numpy.random.rand(), torch.rand(3))
        self.assertEqual(draws[:2], expected_draws[:2])
        self.assertTrue(torch.equal(draws[2], expected_draws[2]))
        self.assertEqual(model[0].weight.data_ptr(), ptr)  # in place
        self.assertEqual(differences(saved, snapshot(model, optim)), [])
        self.assertEqual(optim.param_groups[0]["lr"], saved_lr)
        self.assertEqual(sched.last_epoch, 1)
        self.assertEqual(state["extra"], {"epoch": 3, "seen": [1, 2, 3]})
        self.assertTrue(torch.equal(state["ema"], torch.arange(6, dtype=torch.float64)))
        c.close()

    def test_restore_into_a_fresh_process_state_creates_optimizer_state(self):
        model, optim = model_and_optimizer()
        c = self.checkpointer({"model": model, "optim": optim}, "torch-fresh")
        train(model, optim, steps=4)
        c.save(11).wait_committed("memory", 60)
        saved = snapshot(model, optim)
        c.close()
        # A restarted trainer: same architecture, Adam without state yet.
        model2, optim2 = model_and_optimizer()
        self.assertEqual(optim2.state_dict()["state"], {})
        c2 = self.checkpointer({"model": model2, "optim": optim2}, "torch-fresh")
        self.assertEqual(c2.restore(11, tier="memory"), 11)
        self.assertEqual(differences(saved, snapshot(model2, optim2)), [])
        # And training goes on identically from there.
        torch.manual_seed(3)
        train(model, optim)
        torch.manual_seed(3)
        train(model2, optim2)
        self.assertEqual(differences(snapshot(model, optim), snapshot(model2, optim2)), [])

    def test_sharded_tensor_restores_onto_another_world_size(self):
        full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
        parts = [full[0:3].clone(), full[3:6].clone()]
        for rank in range(2):
            c = self.checkpointer({"w": ckpt.torch.Sharded(parts[rank], (6, 4), (rank * 3, 0))},
                                  "torch-sharded", rank=rank, world_size=2, rng=False)
            handle = c.save_async(1)
            handle.wait_staged()
            c.close()
        handle.wait_committed("disk", 60)
        thirds = [torch.zeros(2, 4) for _ in range(3)]
        for rank in range(3):
            c = self.checkpointer({"w": ckpt.torch.Sharded(thirds[rank], (6, 4), (rank * 2, 0))},
                                  "torch-sharded", rank=rank, world_size=3, rng=False)
            self.assertEqual(c.restore(), 1)
            c.close()
        self.assertTrue(torch.equal(torch.cat(thirds), full))

    def test_replicas_that_disagree_are_suspect_and_rank_local_state_is_not(self):
        # "w" is a data-parallel replica on both ranks; "noise" holds each
        # rank's own values (rank_local). One element of rank 1's "w" flips
        # before step 2: step 2 is suspect for "w" alone.
        ws = [torch.arange(64, dtype=torch.float32) for _ in range(2)]
        noise = [torch.full((8,), float(rank)) for rank in range(2)]
        ranks = [
            self.checkpointer({"w": ws[r], "noise": noise[r]}, "torch-sdc", rank=r,
                              world_size=2, rng=False, rank_local=["noise"]) for r in range(2)
        ]
        with self.assertRaises(ckpt.errors.InvalidArgumentError) as e:
            self.checkpointer({"w": ws[0]}, "torch-sdc", rank_local=["nope"])
        self.assertIn("'nope'", str(e.exception))
        for h in [c.save_async(1) for c in ranks]:
            h.wait_committed("disk", 60)
        ws[1][5] = -1.0
        for h in [c.save_async(2) for c in ranks]:
            h.wait_committed("disk", 60)
        suspects = []
        for _ in range(100):  # compared once both ranks' records are in
            suspects = ranks[0].suspect_steps()
            if suspects:
                break
            time.sleep(0.1)
        self.assertEqual([s["step"] for s in suspects], [2], suspects)
        self.assertEqual([m["item"] for m in suspects[0]["mismatches"]], ["w"])
        self.assertEqual(ranks[0].latest_committed(), 1)  # not resumed from
        for c in ranks:
            c.close()

    def test_shape_change_since_registration_raises(self):
        model, optim = model_and_optimizer()
        c = self.checkpointer({"model": model}, "torch-reshape")
        c.save(1)
        model[2].weight.data = torch.zeros(3, 16)
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            c.save_async(2)
        self.assertIn("tensor 'model/2.weight' changed since it was registered", str(e.exception))
        self.assertIn("[2, 16]", str(e.exception))
        self.assertIn("[3, 16]", str(e.exception))
        c.reset()
        c.save(2)  # accepted after reset()

    def test_unsupported_tensors_raise(self):
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            self.checkpointer({"z": torch.zeros(4, dtype=torch.complex64)}, "torch-bad")
        self.assertIn("tensor 'z': dtype torch.complex64 is not supported", str(e.exception))
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            self.checkpointer({"t": torch.zeros(4, 5).t()}, "torch-bad")
        self.assertIn("'t' is not contiguous", str(e.exception))
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            self.checkpointer({"f": lambda: 1}, "torch-bad")
        self.assertIn("state key 'f'", str(e.exception))
        with self.assertRaises(ckpt.InvalidArgumentError):
            self.checkpointer([torch.zeros(1)], "torch-bad")

    def test_strict_restore_names_missing_keys(self):
        c = self.checkpointer({"a": torch.ones(2)}, "torch-keys")
        c.save(1).wait_committed("memory", 60)
        c.close()
        c = self.checkpointer({"b": torch.ones(2)}, "torch-keys")
        with self.assertRaises(ckpt.NotFoundError) as e:
            c.restore(1)
        self.assertIn("holds keys ['a']", str(e.exception))

    def test_nested_state_dicts_generators_samplers_and_scalers(self):
        model, optim = model_and_optimizer()
        train(model, optim)
        nested = {"model": {k: v for k, v in model.state_dict().items()},
                  "groups": [{"lr": 0.5, "name": "a"}], "pair": (torch.ones(2), 3)}
        gen = torch.Generator().manual_seed(11)
        dataset = list(range(10))
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, seed=5)
        sampler.set_epoch(4)
        scaler = (torch.amp.GradScaler("cpu", init_scale=512.0)
                  if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler") else None)
        state = {"nested": nested, "gen": gen, "sampler": sampler}
        if scaler is not None:
            scaler.scale(torch.ones(1))  # the scale exists from the first use
            state["scaler"] = scaler
        c = self.checkpointer(state, "torch-kinds", rng=False)
        c.save(3).wait_committed("memory", 60)
        want = {k: v.clone() for k, v in nested["model"].items()}
        want_draw = torch.rand(4, generator=gen)  # what the generator gives next
        gen.manual_seed(99)
        sampler.set_epoch(9)
        for v in nested["model"].values():
            v.zero_()
        nested["groups"][0]["lr"] = 0.1
        nested["pair"] = (nested["pair"][0], 7)
        if scaler is not None:
            scaler.update(4.0)
        self.assertEqual(c.restore(3), 3)
        self.assertEqual(differences(nested["model"], want), [])
        self.assertEqual(nested["groups"][0]["lr"], 0.5)
        self.assertEqual(nested["pair"][1], 3)
        self.assertTrue(torch.equal(torch.rand(4, generator=gen), want_draw))
        self.assertEqual(sampler.epoch, 4)
        if scaler is not None:
            self.assertEqual(scaler.get_scale(), 512.0)

    def test_non_persistent_buffers_are_not_saved(self):
        model = torch.nn.Linear(2, 2)
        model.register_buffer("scratch", torch.ones(3), persistent=False)
        model.register_buffer("count", torch.zeros(1))
        c = self.checkpointer({"m": model}, "torch-buffers", rng=False)
        c.save(1).wait_committed("memory", 60)
        model.scratch.fill_(5)
        model.count.fill_(2)
        c.restore(1)
        self.assertEqual(model.count.item(), 0)
        self.assertEqual(model.scratch.tolist(), [5, 5, 5])  # as load_state_dict leaves it

    def test_mismatched_tensors_name_the_parameter_and_both_shapes(self):
        c = self.checkpointer({"m": torch.nn.Linear(4, 3)}, "torch-shapes", rng=False)
        c.save(1).wait_committed("memory", 60)
        c.close()
        c = self.checkpointer({"m": torch.nn.Linear(5, 3)}, "torch-shapes", rng=False)
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            c.restore(1)
        self.assertIn("tensor 'm/weight': step 1 holds float32 [3, 4], the state has float32 [3, 5]",
                      str(e.exception))
        c.close()
        bigger = torch.nn.Linear(4, 3)
        bigger.register_buffer("extra", torch.zeros(2))
        c = self.checkpointer({"m": bigger}, "torch-shapes", rng=False)
        with self.assertRaises(ckpt.NotFoundError) as e:
            c.restore(1)
        self.assertIn("the state has tensors that step 1 of job torch-shapes lacks: m/extra",
                      str(e.exception))
        self.assertIn("m/bias, m/weight", str(e.exception))
        before = bigger.weight.clone()
        self.assertEqual(c.restore(1, strict=False), 1)  # what both have, as load_state_dict
        self.assertFalse(torch.equal(bigger.weight, before))

    def test_a_closed_daemon_raises_with_its_message(self):
        with Daemon() as gone:
            c = ckpt.torch.Checkpointer({"a": torch.ones(2)}, job="torch-gone",
                                        socket=gone.socket, rpc_timeout=5)
            c.save(1)
            gone.kill()
            with self.assertRaises(ckpt.UnavailableError) as e:
                c.save_async(2)
            self.assertIn("is unreachable", str(e.exception))
        with self.assertRaises(ckpt.UnavailableError) as e:
            ckpt.torch.Checkpointer({"a": torch.ones(2)}, job="torch-gone", socket=gone.socket)
        self.assertIn("is ckptd running", str(e.exception))


def same(a, b):
    """Equal values, tensors and arrays compared by their elements."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, numpy.ndarray):
        return a.dtype == b.dtype and numpy.array_equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, ckpt.torch.TensorRef):
        return vars(a) == vars(b)
    return a == b


class UnpickleTest(DaemonTestCase):
    """Restores unpickle checkpoint bytes through an allow-list: no pickle
    runs code in the trainer unless the caller trusts it."""

    def test_a_pickle_that_would_run_code_is_refused_by_name(self):
        marker = os.path.join(tempfile.mkdtemp(prefix="ckpt-pickle-"), "ran")
        state = {"t": torch.ones(3), "evil": RunsCode(marker)}
        c = ckpt.torch.Checkpointer(state, job="pickle-evil",
                                    socket=self.daemon.socket)
        c.save_async(1).wait_committed("disk", 60)
        with self.assertRaises(ckpt.PermissionDeniedError) as e:
            c.restore(1)
        message = str(e.exception)
        self.assertIn("step 1 of job pickle-evil, __ckpt__/extra/evil", message)
        self.assertIn(f"names {os.system.__module__}.system", message)
        self.assertIn("trusted_globals", message)
        self.assertFalse(os.path.exists(marker))
        c.close()

    def test_a_users_class_needs_trusting(self):
        state = {"t": torch.ones(3), "cfg": Config(4)}
        c = ckpt.torch.Checkpointer(state, job="pickle-cfg",
                                    socket=self.daemon.socket)
        c.save_async(1).wait_committed("disk", 60)
        with self.assertRaises(ckpt.PermissionDeniedError) as e:
            c.restore(1)
        self.assertIn(f"{__name__}.Config", str(e.exception))
        c.close()
        for trusted in ([Config], [f"{__name__}.Config"]):
            state = {"t": torch.zeros(3), "cfg": None}
            c = ckpt.torch.Checkpointer(state, job="pickle-cfg",
                                        socket=self.daemon.socket,
                                        trusted_globals=trusted)
            self.assertEqual(c.restore(1), 1)
            self.assertEqual(state["cfg"].depth, 4)
            self.assertTrue(torch.equal(state["t"], torch.ones(3)))
            c.close()

    def test_what_ckpt_saves_passes_the_allow_list(self):
        policy = _unpickle.Policy()
        values = [
            {"rng": torch.get_rng_state(), "np": numpy.random.get_state(),
             "py": random.getstate()},
            collections.OrderedDict(a=[1, 2.5, (3, "x")], b={1, 2}),
            ckpt.torch.TensorRef("m/w", "float32", (2, 3), True),
            [torch.float32, torch.bfloat16, torch.Size([2, 3]),
             torch.arange(6, dtype=torch.int64).reshape(2, 3)[:, 1:],
             numpy.arange(4, dtype=numpy.float32), numpy.float64(2.5)],
        ]
        for value in values:
            back = policy.loads(pickle.dumps(value), "test")
            self.assertTrue(same(back, value), f"{back!r} != {value!r}")
        with self.assertRaises(ckpt.DataLossError) as e:
            policy.loads(b"\x80\x04garbage", "step 3 of job x, item y")
        self.assertIn("step 3 of job x, item y: not a valid pickle",
                      str(e.exception))
        # getattr only picks an allowed Enum's member (as Python >= 3.11
        # pickles them), never another attribute.
        class Sneaky:
            def __reduce__(self):
                return (getattr, (collections.OrderedDict, "fromkeys"))
        with self.assertRaises(ckpt.PermissionDeniedError) as e:
            policy.loads(pickle.dumps(Sneaky()), "t")
        self.assertIn("getattr only a member of an Enum class", str(e.exception))
        unsafe = _unpickle.Policy(unsafe_pickle=True)
        self.assertEqual(unsafe.loads(pickle.dumps(Config(2)), "t").depth, 2)
        with self.assertRaises(ckpt.InvalidArgumentError):
            _unpickle.Policy(trusted_globals=["Config"])


if __name__ == "__main__":
    unittest.main()
