"""FSDP2 (fully_shard, DTensor state) over a real ckptd, with torchrun and the
gloo backend on CPU: four ranks train a small transformer and save every
step asynchronously; two and three ranks (uneven shards) restore the last
step, and every parameter and optimizer tensor, gathered whole, is
bit-identical to the four ranks' after their last step. Through
ckpt.torch.Checkpointer with get_state_dict/set_state_dict, and through DCP
(dcp.async_save / dcp.save with CkptStorageWriter, dcp.load with
CkptStorageReader). Needs PyTorch 2.6 or newer (build/torch-venv)."""

import os
import subprocess
import sys
import tempfile
import unittest

import torch

from ckpt_testing import Daemon, free_port

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    import torch.distributed.checkpoint.state_dict  # noqa: F401
    HAVE_FSDP2 = True
except ImportError:
    HAVE_FSDP2 = False

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fsdp_worker.py")
STEPS = 3


@unittest.skipUnless(HAVE_FSDP2, f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")
class Fsdp2ReshardTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon().start()
        cls.tmp = tempfile.TemporaryDirectory(prefix="ckpt-fsdp-")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()
        cls.tmp.cleanup()

    def torchrun(self, ranks, mode, job, n, out):
        args = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
            str(ranks), "--master-addr", "127.0.0.1", "--master-port",
            str(free_port()), WORKER, mode, self.daemon.socket, job,
            str(n), out
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        if r.returncode != 0:
            self.fail(f"{mode} on {ranks} ranks exited {r.returncode}:\n"
                      f"{r.stdout[-3000:]}\n{r.stderr[-6000:]}\n{self.daemon.log()[-3000:]}")
        return torch.load(out)

    def assertBitIdentical(self, got, want, what):
        self.assertEqual(sorted(got), sorted(want), what)
        differ = [k for k in want if not torch.equal(got[k], want[k])]
        self.assertEqual(differ, [], f"{what}: tensors differ from the reference")

    def reshard(self, save_mode, load_mode, job, worlds):
        path = lambda name: os.path.join(self.tmp.name, f"{job}-{name}.pt")
        want = self.torchrun(4, save_mode, job, STEPS, path("ref"))
        self.assertTrue(any(k.endswith("exp_avg") for k in want), sorted(want)[:8])
        for ranks in worlds:
            got = self.torchrun(ranks, load_mode, job, STEPS - 1, path(ranks))
            self.assertBitIdentical(got, want, f"step {STEPS - 1} restored on {ranks} ranks")
        # The reference is not what a fresh model holds: the restore did it.
        fresh = self.torchrun(2, save_mode, job + "-fresh", 0, path("fresh"))
        self.assertNotEqual([k for k in want if not torch.equal(fresh[k], want[k])], [])

    def test_checkpointer_reshards_fsdp2_state_onto_2_and_3_ranks(self):
        self.reshard("train", "restore", "fsdp-ckpt", (2, 3))

    def test_dcp_async_save_then_load_onto_2_and_3_ranks(self):
        self.reshard("dcp-save", "dcp-load", "fsdp-dcp", (2, 3))

    def test_dcp_save_dedups_replicas_and_loads_onto_3_ranks(self):
        self.reshard("dcp-save-sync", "dcp-load", "fsdp-dcp-sync", (3, ))


if __name__ == "__main__":
    unittest.main()
