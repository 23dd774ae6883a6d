"""Processes the benchmark starts and stops: sliver, tgtd, and the clients it runs against them.

Everything started here is registered in PROCS and stopped by stop_all(), which bench/side-by-side
calls from its exit path (normal end, exception, SIGINT, SIGTERM, SIGHUP).
"""

import json
import os
import random
import signal
import socket
import subprocess
import time

MIB = 1 << 20
GIB = 1 << 30
PROCS = []  # (name, Popen) of every long-running process started by the benchmark
CLEANUP = []  # files outside the scratch directory to remove at the end (tgtd's sockets)


class StepError(RuntimeError):
    """A measured step failed; the message says which command and why."""


class Budget:
    """The run's time limit: every command gets at most what is left of it."""

    def __init__(self, seconds):
        self.total = seconds
        self.deadline = time.monotonic() + seconds

    def left(self):
        return self.deadline - time.monotonic()

    def timeout(self, wanted):
        left = self.left()
        if left <= 1:
            raise StepError("time budget exhausted")
        return min(wanted, left)


BUDGET = Budget(3600)


def log(msg):
    line = f"[bench {time.strftime('%H:%M:%S')}] {msg}"
    print(line, flush=True)


def run(cmd, timeout=120, check=True, env=None, cwd=None):
    """Run a command to completion within the budget; returns (seconds, stdout, stderr)."""
    limit = BUDGET.timeout(timeout)
    started = time.monotonic()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit, env=env, cwd=cwd)
    except subprocess.TimeoutExpired as e:
        raise StepError(f"`{' '.join(map(str, cmd))}` exceeded its {limit:.0f} s limit") from e
    elapsed = time.monotonic() - started
    if check and p.returncode != 0:
        tail = (p.stderr.strip() or p.stdout.strip())[-600:]
        raise StepError(f"`{' '.join(map(str, cmd))}` exited {p.returncode}: {tail}")
    return elapsed, p.stdout, p.stderr


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(path, n=600):
    try:
        with open(path, "rb") as f:
            return f.read()[-n:].decode(errors="replace").strip()
    except OSError:
        return ""


def wait_port(port, seconds=30, proc=None, log_path=None):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log_tail(log_path) if log_path else ""
            raise StepError(f"process exited with {proc.returncode} before listening on {port}"
                            + (f": {tail}" if tail else ""))
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise StepError(f"nothing listens on 127.0.0.1:{port} after {seconds} s")


def spawn(name, cmd, log_path, env=None):
    out = open(log_path, "ab")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                         start_new_session=True)
    out.close()
    PROCS.append((name, p))
    return p


def pinned(cmd, cpus):
    """`cmd` with every thread it starts on CPU list `cpus` (None: wherever the kernel puts
    them)."""
    return cmd if cpus is None else ["taskset", "-c", cpus, *cmd]


def stop(p, grace=15):
    """Stop one process we started (its own process group), politely then firmly."""
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(5)


def stop_all():
    while PROCS:
        name, p = PROCS.pop()
        try:
            stop(p, grace=2 if name == "tgtd" else 60)
        except Exception as e:  # keep stopping the others
            print(f"[bench] stopping {name}: {e}", flush=True)
    while CLEANUP:
        try:
            os.unlink(CLEANUP.pop())
        except OSError:
            pass


def peak_rss(proc):
    """The peak resident set (VmHWM) of a process we started, in bytes; None once it ended."""
    try:
        with open(f"/proc/{proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def size_arg(n):
    """Bytes as the sliver CLI's size syntax, exactly."""
    for unit, mult in (("T", 1 << 40), ("G", GIB), ("M", MIB), ("K", 1024)):
        if n % mult == 0:
            return f"{n // mult}{unit}"
    return str(n)


class Sliver:
    name = "sliver"
    target_iqn = "iqn.2026-11.dev.sliver:array"

    def __init__(self, binary, work, tag, capacity, extra=(), cpus=None):
        self.binary = binary
        self.dir = os.path.join(work, f"sliver-{tag}")
        os.makedirs(self.dir, exist_ok=True)
        self.port, self.api = free_port(), free_port()
        self.log_path = os.path.join(work, f"sliver-{tag}.log")
        cmd = [binary, "serve", "--data-dir", self.dir, "--iscsi-listen",
               f"127.0.0.1:{self.port}", "--api-listen", f"127.0.0.1:{self.api}",
               "--capacity", size_arg(capacity), *extra]
        self.cmd = cmd
        # cpus: the CPU list `taskset -c` pins every thread to (bench/per-core).
        self.proc = spawn(f"sliver-{tag}", pinned(cmd, cpus), self.log_path)
        wait_port(self.port, 60, self.proc, self.log_path)
        wait_port(self.api, 60, self.proc, self.log_path)
        self.env = dict(os.environ, SLIVER_API=f"http://127.0.0.1:{self.api}")
        self.luns = {}

    def cli(self, *args, timeout=60):
        return run([self.binary, *map(str, args)], env=self.env, timeout=timeout)[1]

    def volume(self, name, size, write_cache="write-back"):
        """Create and connect a volume; returns its iscsi:// URL.

        write-back by default, although sliver's own default is write-through: the benchmarks
        compare sliver with tgt's default, which answers writes from the page cache, and must
        compare like with like. bench/write-through asks for write-through explicitly."""
        lun = len(self.luns) + 1
        self.cli("volume", "create", name, "--size", size_arg(size), "--write-cache", write_cache)
        self.cli("volume", "connect", name, "--host", "*", "--lun", lun)
        self.luns[name] = lun
        return self.url(name)

    def url(self, name):
        return f"iscsi://127.0.0.1:{self.port}/{self.target_iqn}/{self.luns[name]}"

    def array(self):
        return json.loads(self.cli("array", "show", "--json"))

    def show(self, name):
        return json.loads(self.cli("volume", "show", name, "--json"))

    def check_alive(self):
        if self.proc.poll() is not None:
            raise StepError(f"sliver exited with {self.proc.returncode}; see {self.log_path}")

    def stop(self):
        stop(self.proc, grace=60)
        if self.proc.returncode not in (0, -signal.SIGTERM):
            raise StepError(f"sliver stopped with status {self.proc.returncode}")


class Tgt:
    name = "tgt"
    target_iqn = "iqn.2026-11.bench:tgt"

    def __init__(self, work, cpus=None):
        self.dir = os.path.join(work, "tgt")
        os.makedirs(self.dir, exist_ok=True)
        self.port = free_port()
        # tgtd's control socket is /var/run/tgtd/socket.N: choose an N no other tgtd uses.
        while True:
            self.control = random.randint(100, 9999)  # tgtd rejects large values
            if not os.path.exists(f"/var/run/tgtd/socket.{self.control}"):
                break
        self.log_path = os.path.join(work, f"tgtd-{self.port}.log")
        CLEANUP.extend(f"/var/run/tgtd/socket.{self.control}{x}" for x in ("", ".lock"))
        self.proc = spawn("tgtd", pinned(["tgtd", "-f", "--iscsi",
                                          f"portal=127.0.0.1:{self.port}",
                                          "-C", str(self.control)], cpus), self.log_path)
        wait_port(self.port, 30, self.proc, self.log_path)
        for _ in range(50):  # the control socket appears a moment after the portal
            if os.path.exists(f"/var/run/tgtd/socket.{self.control}"):
                break
            time.sleep(0.1)
        self.adm("--op", "new", "--mode", "target", "--tid", "1", "-T", self.target_iqn)
        self.adm("--op", "bind", "--mode", "target", "--tid", "1", "-I", "ALL")
        self.luns = {}

    def adm(self, *args):
        return run(["tgtadm", "-C", str(self.control), "--lld", "iscsi", *map(str, args)],
                   timeout=60)[1]

    def volume(self, name, size, sync=False):
        """A sparse backing file as a new LUN; returns its iscsi:// URL. sync=True opens the
        file O_SYNC (`--bsoflags sync`): every write durable before tgt answers, tgt's write
        cache off (its caching mode page still reports WCE=1)."""
        path = os.path.join(self.dir, name + ".img")
        with open(path, "wb") as f:
            f.truncate(size)
        lun = len(self.luns) + 1
        flags = ["--bsoflags", "sync"] if sync else []
        self.adm("--op", "new", "--mode", "logicalunit", "--tid", 1, "--lun", lun, "-b", path,
                 "--bstype", "rdwr", *flags)
        self.adm("--op", "update", "--mode", "logicalunit", "--tid", 1, "--lun", lun,
                 "--params", "thin_provisioning=1")
        self.luns[name] = (lun, path)
        return self.url(name)

    def url(self, name):
        return f"iscsi://127.0.0.1:{self.port}/{self.target_iqn}/{self.luns[name][0]}"

    def open_flags(self, name):
        """The flags tgtd opened the backing file of `name` with (/proc/PID/fdinfo), or None
        when no descriptor of tgtd points at it."""
        path = os.path.realpath(self.luns[name][1])
        fds = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(fds):
            try:
                if os.readlink(os.path.join(fds, fd)) != path:
                    continue
                with open(f"/proc/{self.proc.pid}/fdinfo/{fd}") as f:
                    for line in f:
                        if line.startswith("flags:"):
                            return int(line.split()[1], 8)
            except OSError:
                continue
        return None

    def allocated(self, name):
        return os.stat(self.luns[name][1]).st_blocks * 512

    def check_alive(self):
        if self.proc.poll() is not None:
            raise StepError(f"tgtd exited with {self.proc.returncode}; see {self.log_path}")

    def stop(self):
        # tgtd 1.0.85 in the foreground ignores SIGTERM while it has targets: give it two
        # seconds, then SIGKILL (its backing files are ours and thrown away).
        stop(self.proc, grace=2)
        for suffix in ("", ".lock"):
            try:
                os.unlink(f"/var/run/tgtd/socket.{self.control}{suffix}")
            except OSError:
                pass
