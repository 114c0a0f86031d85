"""Publication through a real ckptd (issue #37): a trainer publishes
committed steps as versions of a topic, cast to bfloat16; a rollout engine
in another process picks up each new version and generates with it, its
weights bit-identical to torch's cast; bad input raises a clear error."""

import gc
import json
import os
import subprocess
import sys
import unittest

import torch

import ckpt
import ckpt.torch
from ckpt_testing import DaemonTestCase


def trainer(seed=3):
    torch.manual_seed(seed)
    model = torch.nn.Linear(16, 8)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    return model, optim


def train_step(model, optim):
    loss = model(torch.randn(4, 16)).square().mean()
    optim.zero_grad()
    loss.backward()
    optim.step()


class PublishTest(DaemonTestCase):

    def save(self, ckp, step):
        handle = ckp.save_async(step)
        handle.wait_staged()
        handle.wait_committed("disk", 60)

    def test_a_rollout_process_picks_up_each_version(self):
        model, optim = trainer()
        ckp = ckpt.torch.Checkpointer({"model": model, "optim": optim},
                                      job="grpo", socket=self.daemon.socket)
        rollout = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "rollout_worker.py"),
             self.daemon.socket, "policy", "3"],
            stdout=subprocess.PIPE, env=dict(os.environ))
        expected = {}
        for version, step in enumerate((2, 4, 6), start=1):
            for _ in range(2):
                train_step(model, optim)
            handle = ckp.save_async(step)
            handle.wait_staged()
            # From the save handle: published once committed on disk.
            record = handle.publish("policy", items=["model/*"], cast="bf16")
            self.assertEqual(record["version"], version)
            self.assertEqual(record["step"], step)
            expected[version] = model.weight.detach().to(torch.bfloat16).view(
                torch.int16).flatten().tolist()
            # The rollout engine sees this version before the next is made.
            line = json.loads(rollout.stdout.readline())
            self.assertEqual(line["version"], version)
            self.assertEqual(line["weight"], expected[version])
        self.assertEqual(rollout.wait(60), 0)
        ckp.close()

    def test_load_into_and_named_tensors_match_torch(self):
        model, optim = trainer(seed=5)
        ckp = ckpt.torch.Checkpointer({"model": model}, job="sft",
                                      socket=self.daemon.socket)
        self.save(ckp, 1)
        ckpt.torch.publish("sft-policy", job="sft", step=1, cast="bf16",
                           socket=self.daemon.socket)
        ckpt.torch.publish("sft-full", job="sft", step=1, socket=self.daemon.socket)
        sub = ckpt.torch.Subscriber("sft-policy", socket=self.daemon.socket)
        tensors = dict(sub.named_tensors())
        self.assertEqual(set(tensors), {"model/weight", "model/bias"})
        for name, value in model.state_dict().items():
            got = tensors[f"model/{name}"]
            self.assertEqual(got.dtype, torch.bfloat16)
            self.assertTrue(torch.equal(got.view(torch.int16),
                                        value.to(torch.bfloat16).view(torch.int16)))
        # As saved (float32) into a float32 module: bit-exact.
        other = torch.nn.Linear(16, 8)
        full = ckpt.torch.Subscriber("sft-full", socket=self.daemon.socket)
        self.assertEqual(full.load_into(other), 1)
        for name, value in model.state_dict().items():
            self.assertTrue(torch.equal(other.state_dict()[name], value))
        ckp.close()

    def test_named_tensors_are_views_pinned_while_held(self):
        # 256 KiB of weights: stored in place, so mapped, not copied.
        model = torch.nn.Linear(256, 256)
        ckp = ckpt.torch.Checkpointer({"model": model}, job="views",
                                      socket=self.daemon.socket)
        self.save(ckp, 1)
        ckpt.torch.publish("views", job="views", step=1, socket=self.daemon.socket)
        sub = ckpt.torch.Subscriber("views", socket=self.daemon.socket)
        original = model.weight.detach().clone()
        kept = dict(sub.named_tensors(1))["model/weight"]
        written = dict(sub.named_tensors(1))["model/weight"]
        self.assertTrue(torch.equal(kept, original))
        # A view is this process's: writing to it changes nothing in ckptd.
        written.add_(1.0)
        self.assertTrue(torch.equal(sub.open(1).tensor("model/weight"), original))
        # Versions 2 and 3 arrive; ckptd keeps two and any version a reader
        # holds: version 1 stays while its views live.
        for step in (2, 3):
            with torch.no_grad():
                model.weight.add_(1.0)
            self.save(ckp, step)
            ckpt.torch.publish("views", job="views", step=step,
                               socket=self.daemon.socket)
        self.assertTrue(torch.equal(sub.open(1).tensor("model/weight"), original))
        self.assertTrue(torch.equal(kept, original))
        self.assertTrue(torch.equal(dict(sub.named_tensors())["model/weight"],
                                    model.weight.detach()))
        # Released, it goes with the next version.
        del kept, written
        gc.collect()
        self.save(ckp, 4)
        ckpt.torch.publish("views", job="views", step=4, socket=self.daemon.socket)
        with self.assertRaises(ckpt.errors.NotFoundError):
            sub.open(1)
        ckp.close()

    def test_bad_input_raises_naming_it(self):
        model, _ = trainer()
        ckp = ckpt.torch.Checkpointer({"model": model}, job="bad",
                                      socket=self.daemon.socket)
        self.save(ckp, 1)
        with self.assertRaisesRegex(ckpt.errors.InvalidArgumentError, "cast to \"fp8\""):
            ckpt.torch.publish("p", job="bad", step=1, cast="fp8", socket=self.daemon.socket)
        with self.assertRaisesRegex(ckpt.errors.InvalidArgumentError, "no item matches"):
            ckpt.torch.publish("p", job="bad", step=1, items=["optim/*"],
                               socket=self.daemon.socket)
        sub = ckpt.torch.Subscriber("nobody", socket=self.daemon.socket)
        with self.assertRaisesRegex(ckpt.errors.NotFoundError, "has no version"):
            sub.open()
        with self.assertRaises(ckpt.errors.DeadlineExceededError):
            sub.wait_for_version(after=0, timeout=0.3)
        # One node, no peers: nothing to subscribe through.
        with self.assertRaisesRegex(ckpt.errors.FailedPreconditionError,
                                    "--peer-address"):
            ckpt.torch.subscribe("p", socket=self.daemon.socket)
        ckpt.torch.publish("p", job="bad", step=1, socket=self.daemon.socket)
        wrong = torch.nn.Linear(16, 4)
        with self.assertRaisesRegex(ckpt.errors.InvalidArgumentError, "has shape"):
            ckpt.torch.Subscriber("p", socket=self.daemon.socket).load_into(wrong)
        ckp.close()


if __name__ == "__main__":
    unittest.main()
