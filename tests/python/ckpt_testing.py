"""Helpers for the Python tests: a real ckptd in temporary directories, and
the test's seed. CKPTD names the daemon binary (set by ctest)."""

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest


def seed():
    """The test's seed: CKPT_TEST_SEED if set, else a fresh one; printed so
    that a failure can be replayed."""
    value = int(os.environ.get("CKPT_TEST_SEED") or random.SystemRandom().randrange(1 << 31))
    print(f"seed {value} (replay with CKPT_TEST_SEED={value})", flush=True)
    return value


class Daemon:
    """ckptd with its own socket, data and tmpfs staging directories; its log
    is kept in the temporary directory and printed by log()."""

    def __init__(self, *extra_args, memory_budget="512M"):
        self.dir = tempfile.mkdtemp(prefix="ckpt-pytest-")
        self.staging = tempfile.mkdtemp(prefix="ckpt-pytest-staging-", dir="/dev/shm")
        self.socket = os.path.join(self.dir, "run", "ckptd.sock")
        self.data_dir = os.path.join(self.dir, "data")
        self.args = [
            os.environ["CKPTD"], "--socket", self.socket, "--data-dir", self.data_dir,
            "--staging-dir", self.staging, "--memory-budget", memory_budget, *extra_args
        ]
        self.proc = None

    def start(self):
        with open(os.path.join(self.dir, "ckptd.log"), "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ckptd exited with {self.proc.returncode}:\n{self.log()}")
            if self.accepting():
                return self
            time.sleep(0.025)
        raise RuntimeError(f"ckptd did not listen on {self.socket}:\n{self.log()}")

    def accepting(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(self.socket)
            return True
        except OSError:
            return False
        finally:
            s.close()

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()
        self.proc = None

    def log(self):
        try:
            with open(os.path.join(self.dir, "ckptd.log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def cleanup(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)
        for suffix in ("", ".peer", ".publish"):
            shutil.rmtree(self.staging + suffix, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.cleanup()


class DaemonTestCase(unittest.TestCase):
    """A test case whose tests share one ckptd (self.daemon)."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon().start()

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


CERTS_TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                          "ckpt-certs")


class Etcd:
    """A real etcd (Debian's etcd-server) on loopback ports, in a temporary
    data directory, run as a deployment runs it: https with a certificate from
    tools/ckpt-certs, and etcd's auth on with a user `ckptd` whose password is
    in a 0600 file. A ckptd reaches it with `daemon_args`."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="ckpt-pytest-etcd-")
        self.port, peer = free_port(), free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        self.pki = os.path.join(self.dir, "pki")
        client_url, peer_url = f"https://{self.endpoint}", f"http://127.0.0.1:{peer}"
        self.args = [
            "/usr/bin/etcd", "--name", "t", "--data-dir", os.path.join(self.dir, "data"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"t={peer_url}",
            "--cert-file", os.path.join(self.pki, "etcd.pem"),
            "--key-file", os.path.join(self.pki, "etcd.key")
        ]
        self.password_file = os.path.join(self.pki, "password")
        self.daemon_args = [
            "--coordinator", f"etcd://{self.endpoint}", "--etcd-ca",
            os.path.join(self.pki, "ca.pem"), "--etcd-user", "ckptd", "--etcd-password-file",
            self.password_file
        ]
        self.proc = None

    def _make_credentials(self):
        with open(os.path.join(self.dir, "etcd.log"), "ab") as log:
            for cmd in (["ca", self.pki], ["node", self.pki, "etcd", "127.0.0.1"]):
                subprocess.run([CERTS_TOOL] + cmd, stdout=log, stderr=log, check=True)
        self.password = os.urandom(16).hex()
        fd = os.open(self.password_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(self.password + "\n")

    def _enable_auth(self):
        etcdctl = [
            "/usr/bin/etcdctl", "--endpoints", f"https://{self.endpoint}", "--cacert",
            os.path.join(self.pki, "ca.pem")
        ]
        root = os.urandom(16).hex()
        steps = [["user", "add", f"root:{root}"], ["user", "grant-role", "root", "root"],
                 ["user", "add", f"ckptd:{self.password}"], ["role", "add", "ckptd"],
                 ["role", "grant-permission", "ckptd", "--prefix=true", "readwrite", "/ckpt/"],
                 ["user", "grant-role", "ckptd", "ckptd"], ["auth", "enable"]]
        env = dict(os.environ, ETCDCTL_API="3")
        with open(os.path.join(self.dir, "etcd.log"), "ab") as log:
            for step in steps:
                subprocess.run(etcdctl + step, stdout=log, stderr=log, env=env, check=True,
                               timeout=20)

    def __enter__(self):
        self._make_credentials()
        with open(os.path.join(self.dir, "etcd.log"), "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    self._enable_auth()
                    return self
            time.sleep(0.025)
        raise RuntimeError("etcd did not start")

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
