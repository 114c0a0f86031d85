"""Failure notification in Python: two ckptd on a real etcd; one is
SIGKILLed and the callback on the other's trainer is told which node left."""

import threading
import unittest

import torch

import ckpt.torch
from ckpt_testing import Daemon, Etcd


class FailureCallbackTest(unittest.TestCase):

    def test_a_killed_node_is_reported_to_the_callback(self):
        with Etcd() as etcd:
            url = f"etcd://{etcd.endpoint}"
            with Daemon("--coordinator", url, "--lease-ttl", "2", "--node-id", "node-a") as a, \
                 Daemon("--coordinator", url, "--lease-ttl", "2", "--node-id", "node-b") as b:
                c = ckpt.torch.Checkpointer({"w": torch.ones(4)}, job="fail", socket=a.socket,
                                            rank=0, world_size=2)
                told, event = [], threading.Event()

                def on_failure(lost):
                    told.extend(lost)
                    event.set()

                c.on_failure(on_failure)
                b.kill()
                self.assertTrue(event.wait(30), "no failure was reported")
                self.assertEqual(told, ["node-b"])
                self.assertEqual(c.lost_nodes(), ["node-b"])
                c.close()


if __name__ == "__main__":
    unittest.main()
