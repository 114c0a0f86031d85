"""ckpt's Python binding over a real ckptd: registration, save, restore, and
the exceptions for bad use."""

import ctypes
import os
import subprocess
import sys
import time
import unittest

import ckpt
from ckpt_testing import Daemon, DaemonTestCase


class BindingTest(DaemonTestCase):

    def connect(self, job, **kw):
        return ckpt.Checkpointer(job, socket=self.daemon.socket, **kw)

    def test_save_and_restore_a_buffer_and_bytes(self):
        data = (ctypes.c_float * 1000)(*range(1000))
        c = self.connect("binding-roundtrip", gather_buffer_bytes=8 << 20,
                         restore_buffer_bytes=16 << 20)
        c.register_tensor("w", "float32", ctypes.addressof(data), [1000])
        c.register_bytes("meta")
        c.set_bytes("meta", b"step seven")
        h = c.save_async(7)
        self.assertEqual(h.step, 7)
        h.order_stream(0)  # host tensors: waits for the copy
        self.assertTrue(h.staged)
        h.wait_staged()
        h.wait_committed("disk", 60)
        self.assertEqual(c.latest_committed("disk"), 7)
        self.assertEqual(c.list_committed("memory"), [7])
        for i in range(1000):
            data[i] = -1.0
        c.set_bytes("meta", b"changed")
        c.restore(7)
        self.assertEqual(list(data), [float(i) for i in range(1000)])
        self.assertEqual(c.get_bytes("meta"), b"step seven")
        c.close()
        self.assertTrue(c.closed)

    def test_no_committed_step_is_none(self):
        c = self.connect("binding-empty")
        self.assertIsNone(c.latest_committed())
        with self.assertRaises(ckpt.NotFoundError) as e:
            c.restore(3)
        self.assertIn("step 3 is not committed", str(e.exception))
        self.assertIsInstance(e.exception, LookupError)

    def test_bad_input_raises_invalid_argument(self):
        c = self.connect("binding-bad")
        data = (ctypes.c_float * 4)()
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            c.register_tensor("x", "complex64", ctypes.addressof(data), [4])
        self.assertIn('tensor "x"', str(e.exception))
        self.assertIn("complex64", str(e.exception))
        self.assertIsInstance(e.exception, ValueError)
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            c.register_tensor("y", "float32", ctypes.addressof(data), [4], [2], [4])
        self.assertIn("outside", str(e.exception))
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            c.latest_committed("tape")
        self.assertIn('unknown tier "tape"', str(e.exception))
        c.register_bytes("b")
        with self.assertRaises(ckpt.AlreadyExistsError):
            c.register_bytes("b")
        with self.assertRaises(ckpt.NotFoundError):
            c.set_bytes("nope", b"")
        with self.assertRaises(ckpt.InvalidArgumentError):
            c.register_bytes("../escape")

    def test_closed_checkpointer_raises(self):
        c = self.connect("binding-closed")
        c.close()
        with self.assertRaises(ckpt.FailedPreconditionError) as e:
            c.save_async(1)
        self.assertIn("closed", str(e.exception))

    def test_no_daemon_raises_unavailable_naming_the_socket(self):
        with self.assertRaises(ckpt.UnavailableError) as e:
            ckpt.Checkpointer("nodaemon", socket=self.daemon.dir + "/absent.sock", rpc_timeout=2)
        self.assertIn("absent.sock does not exist (is ckptd running", str(e.exception))
        self.assertIsInstance(e.exception, ConnectionError)

    def test_restore_peer_wait_is_checked(self):
        c = ckpt.Checkpointer("wait", socket=self.daemon.socket, restore_peer_wait=1.5)
        c.close()
        with self.assertRaises(ckpt.InvalidArgumentError) as e:
            ckpt.Checkpointer("wait", socket=self.daemon.socket, restore_peer_wait=-1)
        self.assertIn("restore_peer_wait is -1", str(e.exception))

    def test_ckpt_socket_names_the_daemon_when_no_socket_is_given(self):
        code = ("import ckpt; c = ckpt.Checkpointer('binding-env'); "
                "print(ckpt.default_socket()); print(c.latest_committed()); c.close()")
        env = dict(os.environ, CKPT_SOCKET=self.daemon.socket)
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout.split(), [self.daemon.socket, "None"])
        env["CKPT_SOCKET"] = self.daemon.dir + "/elsewhere.sock"
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("elsewhere.sock does not exist", out.stderr)

    def test_a_daemon_gone_after_connect_raises_unavailable(self):
        with Daemon() as gone:
            data = (ctypes.c_float * 16)()
            c = ckpt.Checkpointer("gone", socket=gone.socket, rpc_timeout=5)
            c.register_tensor("w", "float32", ctypes.addressof(data), [16])
            c.save_async(1).wait_committed("memory", 30)
            gone.kill()
            with self.assertRaises(ckpt.UnavailableError) as e:
                c.save_async(2)
            self.assertIsInstance(e.exception, ConnectionError)
            self.assertEqual(e.exception.code, "UNAVAILABLE")
            self.assertIn("ckptd", str(e.exception))
            with self.assertRaises(ckpt.UnavailableError):
                c.latest_committed()

    def test_replicas_that_disagree_make_a_suspect_step(self):
        # Two ranks save the same box of "w" (a replicated tensor) with one
        # value flipped on rank 1; "own" is per rank, marked so.
        job = "binding-sdc"
        datas, owns, ranks = [], [], []
        for rank in range(2):
            data = (ctypes.c_float * 256)(*range(256))
            own = (ctypes.c_float * 16)(*([float(rank)] * 16))
            c = ckpt.Checkpointer(job, rank=rank, world_size=2, socket=self.daemon.socket)
            c.register_tensor("w", "float32", ctypes.addressof(data), [256])
            c.register_tensor("own", "float32", ctypes.addressof(own), [16])
            c.mark_rank_local("own")
            datas.append(data)
            owns.append(own)
            ranks.append(c)
        with self.assertRaises(ckpt.NotFoundError) as e:
            ranks[0].mark_rank_local("nothing")
        self.assertIn('no tensor "nothing"', str(e.exception))
        for h in [c.save_async(1) for c in ranks]:
            h.wait_committed("disk", 60)
        self.assertEqual(ranks[0].suspect_steps(), [])
        datas[1][7] = -1.0
        for h in [c.save_async(2) for c in ranks]:
            h.wait_committed("disk", 60)
        suspects = []
        for _ in range(100):  # compared once every rank's record is in
            suspects = ranks[0].suspect_steps()
            if suspects:
                break
            time.sleep(0.1)
        self.assertEqual(len(suspects), 1, suspects)
        self.assertEqual(suspects[0]["step"], 2)
        [m] = suspects[0]["mismatches"]
        self.assertEqual(m["item"], "w")
        self.assertEqual(m["majority_ranks"], [])  # two replicas: no majority
        self.assertEqual(sorted(m["minority_ranks"]), [0, 1])
        self.assertEqual(ranks[1].latest_committed("disk"), 1)  # not resumed from
        for c in ranks:
            c.close()

    def test_dtypes_lists_what_tensors_may_be(self):
        self.assertIn("bfloat16", ckpt.dtypes())
        self.assertIn("float8_e4m3", ckpt.dtypes())


if __name__ == "__main__":
    unittest.main()
