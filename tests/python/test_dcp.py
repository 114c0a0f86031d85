"""ckpt.torch.dcp in one process over a real ckptd: dcp.save, dcp.async_save
and dcp.load keep DCP's planner while the bytes go through ckptd. Needs
PyTorch 2.4 or newer (build/torch-venv); skips on older ones."""

import unittest

import torch

import ckpt
import ckpt.torch
from ckpt_testing import DaemonTestCase

try:
    import torch.distributed.checkpoint as dcp
    from ckpt.torch.dcp import CkptStorageReader, CkptStorageWriter
    from torch.distributed.checkpoint.api import CheckpointException
    HAVE_DCP = hasattr(dcp, "async_save") and hasattr(dcp, "load")
except ImportError:
    HAVE_DCP = False


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16),
                                torch.nn.Linear(16, 3))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(5, 8)).square().mean().backward()
    optim.step()
    return model, optim


def clone(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: clone(v) for k, v in state.items()}
    if isinstance(state, list):
        return [clone(v) for v in state]
    return state


def assert_same(test, got, want, path="state"):
    if isinstance(want, torch.Tensor):
        test.assertTrue(torch.equal(got, want), f"{path} differs")
    elif isinstance(want, dict):
        test.assertEqual(set(got), set(want), path)
        for k in want:
            assert_same(test, got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        test.assertEqual(len(got), len(want), path)
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(test, g, w, f"{path}[{i}]")
    else:
        test.assertEqual(got, want, path)


@unittest.skipUnless(HAVE_DCP, f"PyTorch {torch.__version__} has no "
                     "torch.distributed.checkpoint with async_save (needs 2.4+)")
class DcpStorageTest(DaemonTestCase):

    def writer(self, job, **kw):
        return CkptStorageWriter(job, socket=self.daemon.socket, **kw)

    def reader(self, job, **kw):
        return CkptStorageReader(job, socket=self.daemon.socket, **kw)

    def state(self, seed):
        model, optim = model_and_optimizer(seed)
        return model, {"model": model.state_dict(), "optim": optim.state_dict(),
                       "progress": {"epoch": seed, "note": f"seed {seed}"}}

    def test_save_then_load_into_a_fresh_state(self):
        model, state = self.state(1)
        want = clone(state)
        dcp.save(state, storage_writer=self.writer("dcp-sync"), checkpoint_id=7)
        _, fresh = self.state(2)
        dcp.load(fresh, storage_reader=self.reader("dcp-sync"))
        assert_same(self, fresh, want)
        # The step is a ckptd step of the job, committed on disk.
        probe = ckpt.torch.Checkpointer({}, job="dcp-sync", socket=self.daemon.socket)
        self.assertEqual(probe.list_committed("disk"), [7])
        probe.close()

    def test_async_save_captures_the_state_before_it_returns(self):
        model, state = self.state(3)
        want = clone(state)
        future = dcp.async_save(state, storage_writer=self.writer("dcp-async", step=1))
        with torch.no_grad():  # the trainer goes on at once
            for p in model.parameters():
                p.add_(1.0)
        future.result()
        _, fresh = self.state(4)
        dcp.load(fresh, storage_reader=self.reader("dcp-async", step=1))
        assert_same(self, fresh["model"], want["model"])
        self.assertEqual(fresh["progress"], want["progress"])

    def test_writers_of_later_steps_reuse_the_registration(self):
        model, state = self.state(5)
        for step in range(3):
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(0.5)
            dcp.async_save(state, storage_writer=self.writer("dcp-steps", step=step)).result()
        want = clone(state["model"])
        fresh = {"model": self.state(6)[1]["model"]}
        dcp.load(fresh, storage_reader=self.reader("dcp-steps"))
        assert_same(self, fresh["model"], want)
        older = {"model": self.state(6)[1]["model"]}  # ckptd keeps two steps on disk
        dcp.load(older, storage_reader=self.reader("dcp-steps"), checkpoint_id="ckpt://dcp-steps/1")
        self.assertFalse(torch.equal(older["model"]["0.weight"], want["0.weight"]))

    def test_partial_and_mismatched_loads(self):
        _, state = self.state(7)
        dcp.save(state, storage_writer=self.writer("dcp-partial", step=1))
        # A state asking for a key the step lacks: DCP's planner names it.
        _, fresh = self.state(8)
        fresh["model"]["extra.weight"] = torch.zeros(2)
        with self.assertRaises(CheckpointException) as e:
            dcp.load(fresh, storage_reader=self.reader("dcp-partial"))
        self.assertIn("extra.weight", str(e.exception))
        # A tensor of another shape: named, with both shapes.
        _, fresh = self.state(8)
        fresh["model"]["0.weight"] = torch.zeros(4, 8)
        with self.assertRaises(CheckpointException) as e:
            dcp.load(fresh, storage_reader=self.reader("dcp-partial"))
        self.assertIn("0.weight", str(e.exception))

    def test_bad_ids_and_empty_jobs_are_clear_errors(self):
        _, state = self.state(9)
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            dcp.async_save(state, storage_writer=self.writer("dcp-bad")).result()
        self.assertIn("give step= to the writer", str(e.exception))
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            dcp.save(state, storage_writer=self.writer("dcp-bad"), checkpoint_id="/tmp/x")
        self.assertIn("names no step of job dcp-bad", str(e.exception))
        with self.assertRaises(CheckpointException) as e:
            dcp.load(state, storage_reader=self.reader("dcp-nothing"))
        self.assertIn("job dcp-nothing has no step committed at disk", str(e.exception))
        self.assertTrue(CkptStorageWriter.validate_checkpoint_id("ckpt://job/12"))
        self.assertFalse(CkptStorageReader.validate_checkpoint_id("/checkpoints/12"))

    def test_a_checkpointer_step_is_not_read_as_dcp(self):
        c = ckpt.torch.Checkpointer({"w": torch.ones(3)}, job="dcp-foreign",
                                    socket=self.daemon.socket)
        c.save(1).wait_committed("disk", 60)
        c.close()
        with self.assertRaises(CheckpointException) as e:
            dcp.load({"w": torch.zeros(3)}, storage_reader=self.reader("dcp-foreign"))
        self.assertIn("was not written through ckpt.torch.dcp", str(e.exception))


if __name__ == "__main__":
    unittest.main()
