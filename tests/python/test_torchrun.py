"""torchrun restarts: `torchrun --max-restarts 3` trains FSDP2 ranks (gloo,
CPU) that SIGKILL themselves at seeded random steps and points of a save;
torchrun's agent restarts every rank, each incarnation resumes from the
newest step committed in ckptd's memory tier, and the run ends with
parameters, AdamW state and every rank's RNG state bit-identical to an
uninterrupted run. Needs PyTorch 2.6 or newer (build/torch-venv)."""

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import unittest

import torch

from ckpt_testing import Daemon, free_port, seed

try:
    from torch.distributed.fsdp import fully_shard  # noqa: F401
    HAVE_FSDP2 = True
except ImportError:
    HAVE_FSDP2 = False

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "torchrun_worker.py")
RANKS, STEPS = 2, 8


@unittest.skipUnless(HAVE_FSDP2, f"PyTorch {torch.__version__} has no FSDP2 (fully_shard)")
class TorchrunRestartTest(unittest.TestCase):

    def setUp(self):
        self.daemon = Daemon().start()
        self.tmp = tempfile.TemporaryDirectory(prefix="ckpt-torchrun-")

    def tearDown(self):
        self.daemon.cleanup()
        self.tmp.cleanup()

    def torchrun(self, job, plan, restarts):
        out = os.path.join(self.tmp.name, job)
        os.makedirs(out)
        args = [
            sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
            str(RANKS), "--max-restarts", str(restarts), "--standalone",
            WORKER, self.daemon.socket, job,
            str(STEPS), out, json.dumps(plan)
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1")
        r = subprocess.run(args, capture_output=True, text=True, env=env, timeout=300)
        output = r.stdout + r.stderr
        if r.returncode != 0:
            self.fail(f"torchrun exited {r.returncode}:\n{output[-8000:]}\n"
                      f"{self.daemon.log()[-3000:]}")
        final = torch.load(os.path.join(out, "final.pt"))
        rngs = [torch.load(os.path.join(out, f"rng-{r}.pt")) for r in range(RANKS)]
        return final, rngs, output

    def test_sigkilled_ranks_resume_from_the_newest_commit_bit_identically(self):
        rng = random.Random(seed())
        # The second kill comes after the first one's step: the restarted run
        # resumes at that step at the latest.
        first = rng.randrange(1, STEPS // 2 + 1)
        steps = [first, rng.randrange(first + 1, STEPS - 1)]
        plan = [[restart, rng.randrange(RANKS), steps[restart],
                 rng.choice(["before_save", "during_copy", "after_staged"])]
                for restart in range(2)]
        print(f"kill plan [restart, rank, step, where]: {plan}", flush=True)
        want, want_rngs, _ = self.torchrun("torchrun-reference", [], 0)
        got, got_rngs, output = self.torchrun("torchrun-killed", plan, 3)
        for restart, rank, step, where in plan:
            self.assertIn(f"restart {restart} rank {rank}: SIGKILL at step {step} {where}", output)
        restored = {(int(m.group(1)), int(m.group(2))): m.group(3)
                    for m in re.finditer(r"restart (\d+) rank (\d+): restored (\w+)", output)}
        # Where each incarnation's rank began training (stderr): a rank that
        # restored step s begins at s + 1. Either line proves the restore (a
        # loaded machine once lost a "restored" line of the stdout pipe).
        first = {}
        for m in re.finditer(r"restart (\d+) rank (\d+): step (\d+)", output):
            key = (int(m.group(1)), int(m.group(2)))
            first[key] = min(first.get(key, int(m.group(3))), int(m.group(3)))
        lines = "\n".join(l for l in output.splitlines()
                          if re.search(r"restart \d+ rank \d+: (restored|SIGKILL)", l))
        for restart in (1, 2):  # every incarnation after a kill restored a step
            for rank in range(RANKS):
                said = restored.get((restart, rank))
                began = first.get((restart, rank))
                self.assertTrue(
                    (said is not None and said != "None") or (began or 0) > 0,
                    f"restart {restart} rank {rank}: restored {said}, began at "
                    f"step {began}:\n{lines}\n{output[-4000:]}")
        self.assertEqual(sorted(got), sorted(want))
        differ = [k for k in want if not torch.equal(got[k], want[k])]
        self.assertEqual(differ, [], "tensors differ from the uninterrupted run")
        for rank in range(RANKS):
            self.assertTrue(torch.equal(got_rngs[rank], want_rngs[rank]), f"rank {rank}'s RNG")


if __name__ == "__main__":
    unittest.main()
