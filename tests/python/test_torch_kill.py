"""A real PyTorch training process, SIGKILLed at random steps and restarted
each time (and resumed at other world sizes), ends bitwise identical to an
uninterrupted run: parameters, buffers, Adam state, LR schedule, progress
extras and RNG state. Each killed run captures its state by copy or by fork
(CKPT_HOST_SNAPSHOT), drawn at random."""

import os
import random
import signal
import subprocess
import sys
import tempfile
import unittest

from ckpt_testing import Daemon, seed
from torch_compare import differences, load

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "train_mlp.py")
STEPS = 240


def run(args, kill_after=None, snapshot="copy"):
    """Runs train_mlp.py; with `kill_after`, SIGKILLs it once it reported that
    step. Returns (killed, the steps it restored from, its output)."""
    env = dict(os.environ, CKPT_HOST_SNAPSHOT=snapshot)
    proc = subprocess.Popen([sys.executable, TRAIN, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    restored, lines, killed = [], [], False
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("restored "):
            restored.append(int(line.split()[1]))
        if kill_after is not None and line.startswith("step ") and int(line.split()[1]) >= kill_after:
            proc.send_signal(signal.SIGKILL)
            killed = True
            break
    proc.stdout.close()
    code = proc.wait()
    if not killed and code != 0:
        raise AssertionError(f"train_mlp.py {' '.join(args)} exited {code}:\n{''.join(lines)}")
    return killed, restored, "".join(lines)


def latest_committed(socket):
    """The job's newest step committed on disk, as a restarting trainer sees it."""
    import ckpt
    reader = ckpt.Checkpointer("kill", socket=socket, read_only=True)
    try:
        return reader.latest_committed("disk")
    finally:
        reader.close()


class TorchKillTest(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="ckpt-torch-kill-")
        cls.reference = os.path.join(cls.tmp.name, "reference.pt")
        run(["--no-ckpt", "--steps", str(STEPS), "--out", cls.reference])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def assertSameAsReference(self, out):
        diffs = differences(load(self.reference), load(out))
        self.assertEqual(diffs, [], "\n".join(diffs[:20]))

    def test_sigkill_at_random_steps_then_resume_is_bitwise_identical(self):
        rng = random.Random(seed())
        kills = sorted(rng.sample(range(3, STEPS - 3), 4))
        snapshots = [rng.choice(["copy", "fork"]) for _ in kills]
        print(f"killing after steps {kills}, snapshots {snapshots}", flush=True)
        out = os.path.join(self.tmp.name, "killed.pt")
        with Daemon() as daemon:
            common = ["--socket", daemon.socket, "--job", "kill", "--steps", str(STEPS),
                      "--save-every", "7", "--out", out]
            # (kill step, newest step committed once the trainer was dead)
            committed_at_kill = []
            runs = [("kill", k, snapshot) for k, snapshot in zip(kills, snapshots)]
            runs.append(("finish", None, rng.choice(["copy", "fork"])))
            for i, (what, k, snapshot) in enumerate(runs):
                killed, restored, log = run(common, kill_after=k, snapshot=snapshot)
                self.assertEqual(killed, what == "kill", log)
                self.assertLessEqual(len(restored), 1, log)
                if i == 0:
                    self.assertEqual(restored, [], log)  # a new job
                else:
                    # The run after a kill resumes from a committed step: at
                    # least the newest one committed before it started (a
                    # save staged before the kill may commit later), never one
                    # past the kill.
                    prev_kill, newest = committed_at_kill[-1]
                    if newest is None:
                        self.assertTrue(not restored or restored[0] <= prev_kill, log)
                    else:
                        self.assertEqual(len(restored), 1, log)
                        self.assertGreaterEqual(restored[0], newest, log)
                        self.assertLessEqual(restored[0], prev_kill, log)
                if killed:
                    committed_at_kill.append((k, latest_committed(daemon.socket)))
            print(f"committed when killed: {committed_at_kill}", flush=True)
            # Not every kill may come before the job's first commit.
            self.assertIsNotNone(committed_at_kill[-1][1])
            self.assertIn("done", log)
            self.assertSameAsReference(out)

    def test_resume_at_other_world_sizes_is_bitwise_identical(self):
        with Daemon() as daemon:
            schedule = [(2, 90), (3, 170), (1, STEPS)]  # (world size, stop at)
            outs = []
            for world, stop in schedule:
                procs = []
                for rank in range(world):
                    out = os.path.join(self.tmp.name, f"w{world}-r{rank}.pt")
                    args = ["--socket", daemon.socket, "--job", "elastic", "--steps", str(STEPS),
                            "--stop-at", str(stop), "--save-every", "10", "--rank", str(rank),
                            "--world-size", str(world), "--out", out]
                    procs.append(subprocess.Popen([sys.executable, TRAIN, *args],
                                                  stdout=subprocess.PIPE,
                                                  stderr=subprocess.STDOUT, text=True))
                    outs.append(out)
                for p in procs:
                    log, _ = p.communicate()
                    self.assertEqual(p.returncode, 0, log)
                    if world != 2:
                        self.assertIn("restored", log)
            # The last run (world size 1) finished the job.
            self.assertSameAsReference(outs[-1])


if __name__ == "__main__":
    unittest.main()
