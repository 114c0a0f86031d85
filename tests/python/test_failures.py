"""Failure notification in Python: two ckptd on a real etcd; one is
SIGKILLed and the callback on the other's trainer is told which node left."""

import threading
import unittest

import torch

import ckpt
import ckpt.torch
from ckpt_testing import Daemon, Etcd


class FailureCallbackTest(unittest.TestCase):

    def test_a_killed_node_is_reported_to_the_callback(self):
        with Etcd() as etcd:
            node = lambda id: etcd.daemon_args + ["--lease-ttl", "2", "--node-id", id]
            with Daemon(*node("node-a")) as a, Daemon(*node("node-b")) as b:
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


class RejoinTest(unittest.TestCase):

    def test_processes_rejoin_at_a_new_world_size_and_restore(self):
        with Daemon() as daemon:
            full = torch.arange(12, dtype=torch.float32)
            # Two ranks save the whole (replicated) tensor at step 5.
            saver = [ckpt.torch.Checkpointer({"w": full.clone()}, job="el", socket=daemon.socket,
                                             rank=r, world_size=2, rng=False) for r in range(2)]
            for c in saver:
                handle = c.save_async(5)
                handle.wait_staged()
            handle.wait_committed("disk", 60)
            # Three processes (threads here) rejoin; each gets a distinct rank
            # of a world of 3 and the same NCCL id, then restores in place.
            results, errors = {}, []

            def member(name):
                try:
                    state = {"w": torch.zeros(12)}
                    c = ckpt.torch.Checkpointer(state, job="el", socket=daemon.socket,
                                                rank=0, world_size=1, rng=False)
                    epoch = c.rejoin(2, 3, participant=name, settle=0.5, timeout=30,
                                     tier="disk")
                    self.assertEqual(epoch["resume_step"], 5)
                    self.assertEqual(c.restore(), 5)
                    results[name] = (epoch, state["w"].clone())
                except Exception as e:  # reported below
                    errors.append(e)

            threads = [threading.Thread(target=member, args=(n, )) for n in ("m-b", "m-a", "m-c")]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            ranks = sorted(e["rank"] for e, _ in results.values())
            self.assertEqual(ranks, [0, 1, 2])
            self.assertEqual(results["m-a"][0]["rank"], 0)
            self.assertEqual({e["world_size"] for e, _ in results.values()}, {3})
            self.assertEqual(len({e["nccl_unique_id"] for e, _ in results.values()}), 1)
            for _, w in results.values():
                self.assertTrue(torch.equal(w, full))
        with self.assertRaises(ckpt.UnavailableError):
            ckpt.rejoin("el", socket=daemon.socket, timeout=1)


if __name__ == "__main__":
    unittest.main()
