"""Fake remote hosts for end-to-end tests of Ray's cluster launcher on one Linux machine.

`FakeHosts` creates a network namespace in which every fake host is an sshd listening on its own
address (head 127.0.0.2, worker 127.0.0.3 by default). Each host is
`unshare --pid --mount --fork --mount-proc --kill-child` running sshd as PID 1 of its own PID
namespace, with a private mount namespace:

* /root is a copy-on-write overlay of the real /root (the venv's interpreter may live below
  /root, e.g. pyenv), its upper layer on a private tmpfs, so the real /root is never written;
* /tmp is a per-host directory below `base_dir` (kept after `down()` for post-mortem Ray logs);
* /run, /dev/shm and ~/.ray are private tmpfs mounts (a fresh machine: no Ray auth token);
* ~/.bashrc puts the venv's bin on PATH, because Ray runs every remote command as
  `bash --login -c -i 'source ~/.bashrc; ...'`.

Why a PID namespace per host: `ray stop` as root kills every Ray process it can see, so each
host must only see its own processes. Killing a host's PID 1 makes the kernel kill every process
started through it, which is how `down()` guarantees that nothing survives a test.

The launching process (the code calling `ray.autoscaler.sdk`) must run inside the network
namespace, where the hosts' addresses are reachable: `FakeHosts.run_in_netns()` or
`FakeHosts.netns_prefix()`. Requires root, `ip` (iproute2), `unshare`/`nsenter` (util-linux),
`sshd` (openssh-server), `ssh`/`ssh-keygen` (openssh-client) and `rsync`.
"""

from __future__ import annotations

import contextlib
import ctypes
import getpass
import hashlib
import itertools
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

HEAD_IP = "127.0.0.2"
WORKER_IP = "127.0.0.3"
SSH_PORT = 22

# Binaries whose absence makes the harness unusable: conftest skips on these (and on non-root).
REQUIRED_COMMANDS = ("ip", "unshare", "sshd", "rsync")

_CLONE_NEWNET = 0x40000000
_instance_counter = itertools.count()
_cluster_counter = itertools.count()
# Markers of Ray processes in a command line: the `ray` CLI, site-packages/ray/... scripts,
# worker process titles (`ray::IDLE`), and the native daemons.
_RAY_PROCESS_RE = re.compile(r"(^|[\s/])ray(::|/|\s|$)|raylet|gcs_server")


class FakeHostsError(RuntimeError):
    """Setting up or talking to the fake hosts failed."""


@dataclass(frozen=True)
class HostSpec:
    """One fake host: a name (used by the helpers) and the address its sshd listens on."""

    name: str
    listen: str


@dataclass(frozen=True)
class HostProcess:
    """A process running on a fake host (`pid` is the PID seen from the real host)."""

    pid: int
    cmdline: str


DEFAULT_HOSTS = (HostSpec("head", HEAD_IP), HostSpec("worker", WORKER_IP))


def missing_prerequisites() -> list[str]:
    """Reasons why FakeHosts cannot run here (empty list: it can)."""
    problems = [] if os.geteuid() == 0 else ["needs root (network/PID/mount namespaces)"]
    problems += [f"`{cmd}` not found" for cmd in REQUIRED_COMMANDS if _which(cmd) is None]
    return problems


def unique_cluster_name(prefix: str = "fh") -> str:
    """A cluster name not used before in this process or by another one.

    Ray keys its ssh ControlMaster socket (10 s ControlPersist, under /tmp/ray_ssh_*) and its
    cluster state file by cluster name, so reusing a name across tests can hit stale state.
    """
    return f"{prefix}-{os.getpid()}-{next(_cluster_counter)}-{os.urandom(2).hex()}"


def ssh_control_dir(cluster_name: str) -> Path:
    """Where a launching process keeps the ssh ControlMaster sockets of a cluster.

    Ray hard-codes /tmp/ray_ssh_<hash(user)>/<hash(cluster name)> (TMPDIR does not move it);
    remove it after a test so the real /tmp does not collect one directory per cluster name.
    """
    user = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
    cluster = hashlib.sha256(cluster_name.encode()).hexdigest()[:10]
    return Path(f"/tmp/ray_ssh_{user}/{cluster}")


def launcher_env(
    scratch_dir: Path,
    extra: Mapping[str, str] | None = None,
    *,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Environment for a process that launches a cluster through `ray.autoscaler.sdk`.

    `scratch_dir` should be per test: Ray keeps cluster state/locks and its config cache in
    RAY_TMPDIR/TMPDIR, which would otherwise leak between tests.
    """
    tmp = scratch_dir / "launcher-tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ if base is None else base)
    # a Ray the test process itself uses must not be mistaken for the cluster's
    env.pop("RAY_ADDRESS", None)
    env.update(
        # autoscaler v2 (default for `ray up` since 2.50) never launches workers of provider local
        RAY_UP_enable_autoscaler_v2="0",
        RAY_TMPDIR=str(tmp),
        TMPDIR=str(tmp),
        RAY_USAGE_STATS_ENABLED="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra or {})
    return env


# A dir whose sitecustomize.py makes Ray's teardown use a thread pool (see there).
_THREAD_POOL_TEARDOWN = Path(__file__).parent / "thread_pool_teardown"


def thread_pool_teardown_env() -> dict[str, str]:
    """More environment for a launching process (`launcher_env`'s `extra`): Ray's local
    provider then terminates nodes through a thread pool, as Ray's docker teardown does,
    which fails when left to the interpreter's exit."""
    path = os.environ.get("PYTHONPATH")
    return {"PYTHONPATH": f"{_THREAD_POOL_TEARDOWN}:{path}" if path else str(_THREAD_POOL_TEARDOWN)}


def call_in_netns(netns: str, fn: Callable[[], T]) -> T:
    """Run `fn` in a thread switched into network namespace `netns` and return its result.

    Network namespaces are per thread, so the rest of the (pytest) process stays where it was;
    sockets created by `fn` keep belonging to `netns`.
    """
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(f"/run/netns/{netns}", "rb") as ns_file:
                if libc.setns(ns_file.fileno(), _CLONE_NEWNET) != 0:
                    err = ctypes.get_errno()
                    raise OSError(err, f"setns({netns}): {os.strerror(err)}")
            result.append(fn())
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, name=f"netns-{netns}", daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


def free_port(netns: str | None = None, host: str = "127.0.0.1") -> int:
    """A TCP port that is free on `host` (inside `netns` if given)."""

    def pick() -> int:
        with socket.socket() as sock:
            sock.bind((host, 0))
            return int(sock.getsockname()[1])

    return call_in_netns(netns, pick) if netns else pick()


def port_open(host: str, port: int, netns: str | None = None, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on host:port (inside `netns` if given)."""

    def probe() -> bool:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                return True
        except OSError:
            return False

    return call_in_netns(netns, probe) if netns else probe()


# The project checkout these tests run from.
_CHECKOUT = Path(__file__).resolve().parents[2]


def _under_tmp(path: Path) -> bool:
    return Path(path).resolve().is_relative_to("/tmp")


def _which(cmd: str) -> str | None:
    # sshd lives in /usr/sbin, which is not on every PATH
    return shutil.which(cmd) or shutil.which(cmd, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _require(cmd: str) -> str:
    path = _which(cmd)
    if path is None:
        raise FakeHostsError(f"`{cmd}` not found (apt-get install openssh-server rsync iproute2)")
    return path


def _run(cmd: Sequence[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kwargs)


def _keygen(path: Path, comment: str = "") -> None:
    for old in (path, Path(f"{path}.pub")):  # ssh-keygen would ask before overwriting
        old.unlink(missing_ok=True)
    _run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])


def _netns_exists(name: str) -> bool:
    return Path("/run/netns", name).exists()


def _read_ppid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:  # the process exited while we looked
        return None
    return None


def _proc_state(pid: str) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = _proc_state(str(pid))
        if state is None or state == "Z":
            return True
        time.sleep(0.05)
    return False


class FakeHosts:
    """Fake SSH hosts in a private network namespace; use as a context manager.

    with FakeHosts() as hosts:
        config = hosts.local_cluster_config(unique_cluster_name())
        # ... write config for launch.py, then run it where 127.0.0.2/3 are reachable:
        hosts.run_in_netns([sys.executable, "launch.py"], env=launcher_env(tmp_path))
        assert hosts.host_path("worker", "/tmp/out.txt").exists()
        assert hosts.wait_no_ray_processes("worker") == []
    """

    def __init__(
        self,
        base_dir: Path | None = None,
        *,
        name: str | None = None,
        hosts: Sequence[HostSpec] = DEFAULT_HOSTS,
        local_cidrs: Sequence[str] = (),
        accept_generated_keys: bool = False,
        venv: Path | None = None,
        start_timeout: float = 20.0,
    ) -> None:
        """
        base_dir: scratch dir for keys, sshd logs and each host's /tmp (default: a new temp dir,
            deleted by `down()`; a given dir is left in place so Ray's logs can be inspected).
        name: network namespace name (default: unique per process and instance).
        hosts: the hosts and their sshd listen addresses inside the netns.
        local_cidrs: extra prefixes made local on the netns loopback (e.g. a cloud VPC range).
        accept_generated_keys: also accept, at login, the public half of every `*.pem` below
            `key_dir` (<base_dir>/keys, bind-mounted into the hosts): for keys created while a
            cluster is launched, e.g. by Ray's AWS provider in the launcher's ~/.ssh.
        venv: virtualenv whose `ray` the hosts run (default: the current interpreter's).
        """
        if len({h.name for h in hosts}) != len(hosts):
            raise ValueError("host names must be unique")
        self.name = name or f"fh-{os.getpid()}-{next(_instance_counter)}"
        self.hosts = tuple(hosts)
        self.local_cidrs = tuple(local_cidrs)
        self.accept_generated_keys = accept_generated_keys
        self.venv = venv or Path(sys.prefix)
        self.start_timeout = start_timeout
        self._given_base_dir = base_dir
        self._base_dir: Path | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._init_pids: dict[str, int] = {}
        self._netns_created = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> FakeHosts:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.down()

    def start(self) -> FakeHosts:
        """Create the netns and start every host; on any failure, clean up and re-raise."""
        if self._procs or self._netns_created:
            raise FakeHostsError(f"{self.name} is already started")
        problems = missing_prerequisites()
        if problems:
            raise FakeHostsError("; ".join(problems))
        try:
            self._start()
        except BaseException:
            self.down()
            raise
        return self

    def _start(self) -> None:
        if self._given_base_dir is not None:
            self._given_base_dir.mkdir(parents=True, exist_ok=True)
            self._base_dir = self._given_base_dir
        else:
            self._base_dir = Path(tempfile.mkdtemp(prefix=f"{self.name}-"))
        base = self._base_dir
        _keygen(self.private_key, comment=self.name)
        ip = _require("ip")
        if _netns_exists(self.name):
            # left over by a crashed run that got the same name (same pid): replace it
            leftover = subprocess.run(
                [ip, "netns", "pids", self.name], capture_output=True, text=True
            ).stdout.split()
            warnings.warn(
                f"removing leftover netns {self.name} (processes still in it: {leftover})",
                stacklevel=3,
            )
            _run([ip, "netns", "del", self.name])
        _run([ip, "netns", "add", self.name])
        self._netns_created = True
        _run([ip, "-n", self.name, "link", "set", "lo", "up"])
        for cidr in self.local_cidrs:
            # on loopback the whole prefix becomes local: every address in it reaches our sshd
            _run([ip, "-n", self.name, "addr", "add", cidr, "dev", "lo"])
        for host in self.hosts:
            self._launch_host(host, base)
        deadline = time.monotonic() + self.start_timeout
        for host in self.hosts:
            self._wait_host(host, deadline)

    def _launch_host(self, host: HostSpec, base: Path) -> None:
        conf = base / "conf" / host.name
        tmp = base / host.name / "tmp"
        for stale in (conf, tmp):  # a base_dir reused from an earlier start: fresh machines
            shutil.rmtree(stale, ignore_errors=True)
            stale.mkdir(parents=True)
        tmp.chmod(0o1777)  # like a real /tmp: Ray and users write there
        _keygen(conf / "host_key")
        shutil.copy(f"{self.private_key}.pub", conf / "authorized_keys")
        (conf / "bashrc").write_text(self._bashrc())
        key_cmd = ""
        if self.accept_generated_keys:
            # sshd runs AuthorizedKeysCommand only from a path whose parent dirs are not
            # world-writable: it is copied into the host's private /run below.
            (conf / "authkeys.sh").write_text(
                "#!/bin/sh\n"
                "find /run/fakehost/keys -name '*.pem' -type f 2>/dev/null |\n"
                '  while read -r key; do ssh-keygen -y -f "$key" 2>/dev/null; done\n'
                "exit 0\n"
            )
            (conf / "authkeys.sh").chmod(0o755)
            key_cmd = (
                "AuthorizedKeysCommand /run/fakehost/authkeys.sh\nAuthorizedKeysCommandUser root\n"
            )
        (conf / "sshd_config").write_text(
            f"Port {SSH_PORT}\n"
            f"ListenAddress {host.listen}\n"
            "HostKey /run/fakehost/host_key\n"
            "AuthorizedKeysFile /run/fakehost/authorized_keys\n"
            f"{key_cmd}"
            "PidFile none\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM no\n"
            "StrictModes no\n"
            "PrintMotd no\n"
            "PrintLastLog no\n"
            # Ray opens many parallel ssh sessions (updaters, rsync, ControlMaster)
            "MaxStartups 100:30:200\n"
            "MaxSessions 100\n"
            "LogLevel ERROR\n"
        )
        q = shlex.quote
        bind_keys = ""
        if self.accept_generated_keys:
            self.key_dir.mkdir(parents=True, exist_ok=True)
            bind_keys = (
                "mkdir /run/fakehost/keys\n"
                f"mount --bind {q(str(self.key_dir))} /run/fakehost/keys\n"
            )
        # The venv and this checkout must stay visible on the hosts even when they live
        # below /tmp (a CI clone may): bind them aside, then back over the private /tmp.
        shared = sorted({str(p) for p in (self.venv.resolve(), _CHECKOUT) if _under_tmp(p)})
        stash = "".join(
            f"mkdir -p /run/fakehost/keep/{i}\nmount --bind {q(path)} /run/fakehost/keep/{i}\n"
            for i, path in enumerate(shared)
        )
        restore = "".join(
            f"mkdir -p {q(path)}\nmount --bind /run/fakehost/keep/{i} {q(path)}\n"
            for i, path in enumerate(shared)
        )
        # Order matters: conf and key_dir may live below /tmp, so copy/bind them before /tmp is
        # replaced. A private /run holds sshd's privsep dir and the overlay's upper layer (tmpfs
        # works as an overlay upper even where base_dir is itself on overlayfs, e.g. in Docker).
        script = (
            "set -eu\n"
            "mount -t tmpfs -o mode=755 fakehost-run /run\n"
            "mkdir -p /run/sshd /run/fakehost/root-upper /run/fakehost/root-work\n"
            f"cp -a {q(str(conf))}/. /run/fakehost/\n"
            f"{bind_keys}"
            "mount -t overlay overlay -o lowerdir=/root,upperdir=/run/fakehost/root-upper,"
            "workdir=/run/fakehost/root-work /root\n"
            "mkdir -p /root/.ray\n"
            "mount -t tmpfs -o mode=700 fakehost-dotray /root/.ray\n"
            "mount -t tmpfs -o mode=1777 fakehost-shm /dev/shm\n"
            f"{stash}"
            f"mount --bind {q(str(tmp))} /tmp\n"
            f"{restore}"
            "cp /run/fakehost/bashrc /root/.bashrc\n"
            f"exec {q(_require('sshd'))} -D -e -f /run/fakehost/sshd_config\n"
        )
        namespaces = "--pid --mount --fork --mount-proc --kill-child --propagation private"
        cmd = [*self.netns_prefix(), _require("unshare"), *namespaces.split(), "sh", "-c", script]
        with open(base / f"{host.name}.log", "wb") as log:
            # own session: a Ctrl-C aimed at pytest's process group must not hit the host
            self._procs[host.name] = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_host(self, host: HostSpec, deadline: float) -> None:
        proc = self._procs[host.name]
        probe = "127.0.0.1" if host.listen in ("0.0.0.0", "::") else host.listen
        while True:
            if proc.poll() is not None:
                raise FakeHostsError(
                    f"fake host {host.name} exited with {proc.returncode}: {self._log(host.name)}"
                )
            if host.name not in self._init_pids:
                init = self._find_child(proc.pid)
                if init is not None:
                    self._init_pids[host.name] = init
            if host.name in self._init_pids and self._ssh_banner(probe):
                return
            if time.monotonic() > deadline:
                raise FakeHostsError(
                    f"sshd of {host.name} did not answer on {probe}:{SSH_PORT}: "
                    f"{self._log(host.name)}"
                )
            time.sleep(0.05)

    def _ssh_banner(self, addr: str) -> bool:
        def probe() -> bool:
            try:
                with socket.create_connection((addr, SSH_PORT), timeout=1) as sock:
                    return sock.recv(4).startswith(b"SSH-")
            except OSError:
                return False

        return call_in_netns(self.name, probe)

    @staticmethod
    def _find_child(parent: int) -> int | None:
        # the host's PID 1 (sshd) is the child that `unshare --fork` made
        for entry in os.listdir("/proc"):
            if entry.isdigit() and _read_ppid(entry) == parent:
                return int(entry)
        return None

    def _log(self, host: str) -> str:
        if self._base_dir is None:
            return ""
        try:
            return (self._base_dir / f"{host}.log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def down(self) -> None:
        """Stop every host, delete the netns and the scratch dir we created. Idempotent.

        SIGKILL, not SIGTERM: `unshare --fork` ignores SIGTERM while it waits. Killing the PID
        namespace's init makes the kernel kill every process started on that host; its mounts
        disappear with its mount namespace.
        """
        errors: list[str] = []
        for host, proc in self._procs.items():
            init = self._init_pids.get(host)
            if proc.poll() is None:
                # kill the host's init first so that `unshare` (its parent) reaps it; if it is
                # not known yet (failed start), kill `unshare`: --kill-child takes its child
                with contextlib.suppress(ProcessLookupError):
                    os.kill(init if init is not None else proc.pid, signal.SIGKILL)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGKILL)
                try:
                    proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    errors.append(f"{host}: unshare pid {proc.pid} did not exit")
            if init is not None and not _wait_gone(init, 10):
                errors.append(f"{host}: init pid {init} did not exit")
        self._procs.clear()
        self._init_pids.clear()
        if self._netns_created:
            ip = _which("ip") or "ip"
            res = subprocess.run([ip, "netns", "del", self.name], capture_output=True, text=True)
            if res.returncode != 0 and _netns_exists(self.name):
                errors.append(f"ip netns del {self.name}: {res.stderr.strip()}")
            self._netns_created = False
        if self._base_dir is not None and self._given_base_dir is None:
            shutil.rmtree(self._base_dir, ignore_errors=True)
        self._base_dir = None
        if errors:
            raise FakeHostsError("; ".join(errors))

    # ------------------------------------------------------------------ accessors

    @property
    def base_dir(self) -> Path:
        if self._base_dir is None:
            raise FakeHostsError(f"{self.name} is not started")
        return self._base_dir

    @property
    def private_key(self) -> Path:
        """SSH private key accepted by every host as root."""
        return self.base_dir / "id_ed25519"

    @property
    def auth(self) -> dict[str, str]:
        """The `auth` section of a Ray cluster config for these hosts."""
        return {"ssh_user": "root", "ssh_private_key": str(self.private_key)}

    @property
    def key_dir(self) -> Path:
        """Directory whose `*.pem` keys the hosts accept (`accept_generated_keys=True`)."""
        if not self.accept_generated_keys:
            raise FakeHostsError("FakeHosts(accept_generated_keys=True) has no key_dir")
        return self.base_dir / "keys"

    def address(self, host: str) -> str:
        return self._spec(host).listen

    def tmp_dir(self, host: str) -> Path:
        """The real-host directory that is `host`'s /tmp (still readable after `down()`)."""
        self._spec(host)
        return self.base_dir / host / "tmp"

    def init_pid(self, host: str) -> int:
        """PID (as seen from the real host) of the host's PID 1, its sshd."""
        self._spec(host)
        pid = self._init_pids.get(host)
        proc = self._procs.get(host)
        if pid is None or proc is None or proc.poll() is not None:
            raise FakeHostsError(f"fake host {host} is not running: {self._log(host)}")
        return pid

    def _spec(self, host: str) -> HostSpec:
        for spec in self.hosts:
            if spec.name == host:
                return spec
        raise KeyError(f"no fake host {host!r} (have {[h.name for h in self.hosts]})")

    # ------------------------------------------------------------------ running things

    def netns_prefix(self) -> list[str]:
        """Command prefix that runs a command inside the netns: `ip netns exec NAME`."""
        return [_require("ip"), "netns", "exec", self.name]

    def run_in_netns(
        self,
        cmd: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        **popen_kwargs: Any,
    ) -> subprocess.CompletedProcess[Any]:
        """`subprocess.run(cmd)` inside the netns, where the hosts' addresses are reachable.

        Defaults: text output captured (stdout+stderr merged), check=False.
        """
        popen_kwargs.setdefault("text", True)
        if "stdout" not in popen_kwargs and "capture_output" not in popen_kwargs:
            popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return subprocess.run(
            [*self.netns_prefix(), *cmd],
            env=dict(env) if env is not None else None,
            **popen_kwargs,
        )

    def run_on_host(
        self, host: str, cmd: Sequence[str], **popen_kwargs: Any
    ) -> subprocess.CompletedProcess[Any]:
        """Run `cmd` directly on a fake host (its mount, network and PID namespaces), not via ssh.

        Handy for checks and debugging; the command sees the host's /tmp and /root.
        """
        popen_kwargs.setdefault("text", True)
        popen_kwargs.setdefault("capture_output", True)
        ns_cmd = [
            _require("nsenter"),
            "--target",
            str(self.init_pid(host)),
            "--mount",
            "--net",
            "--pid",
            "--",
        ]
        return subprocess.run([*ns_cmd, *cmd], **popen_kwargs)

    # ------------------------------------------------------------------ inspecting hosts

    def host_path(self, host: str, path: str | os.PathLike[str]) -> Path:
        """Real-host path through which `path` (absolute or `~/...`) on `host` can be read.

        Goes through /proc/<pid>/root, i.e. the host's own mount namespace (its /tmp, its /root
        overlay), so it only works while the host is running.
        """
        text = os.fspath(path)
        if text == "~" or text.startswith("~/"):
            text = "/root" + text[1:]
        if not text.startswith("/"):
            raise ValueError(f"need an absolute or ~ path, got {text!r}")
        return Path(f"/proc/{self.init_pid(host)}/root") / text.lstrip("/")

    def processes(self, host: str) -> list[HostProcess]:
        """Live processes on `host` other than its sshd's (zombies excluded)."""
        init = self.init_pid(host)
        pidns = os.readlink(f"/proc/{init}/ns/pid")
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.readlink(f"/proc/{entry}/ns/pid") != pidns:
                    continue
                raw = Path(f"/proc/{entry}/cmdline").read_bytes()
                comm = Path(f"/proc/{entry}/comm").read_text().strip()
            except OSError:  # exited meanwhile
                continue
            # sshd, and sshd-session/sshd-auth of OpenSSH >= 9.8
            if comm.startswith("sshd") or _proc_state(entry) in (None, "Z"):
                continue
            cmdline = raw.replace(b"\0", b" ").decode(errors="replace").strip()
            found.append(HostProcess(int(entry), cmdline))
        return sorted(found, key=lambda p: p.pid)

    def ray_processes(self, host: str) -> list[HostProcess]:
        """Ray processes (CLI, daemons, workers, dashboard, ...) still running on `host`."""
        return [p for p in self.processes(host) if _RAY_PROCESS_RE.search(p.cmdline)]

    def wait_no_ray_processes(self, host: str, timeout: float = 30.0) -> list[HostProcess]:
        """Wait until no Ray process runs on `host`; return those still there at `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            left = self.ray_processes(host)
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def kill_leftovers(self) -> list[HostProcess]:
        """SIGKILL every process on every host except sshd (e.g. after a test that failed
        before its teardown); return what was killed."""
        killed = []
        for spec in self.hosts:
            for proc in self.processes(spec.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                    killed.append(proc)
        return killed

    def set_env(self, env: Mapping[str, str]) -> None:
        """Export `env` in every later remote command on every host (via ~/.fakehost_env).

        Replaces what an earlier call set. Used for things known only after start, such as
        the endpoint of a moto server for the AWS provider.
        """
        lines = "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        for spec in self.hosts:
            self.host_path(spec.name, "/root/.fakehost_env").write_text(lines)

    def _bashrc(self) -> str:
        return (
            "# fake host: Ray runs commands as bash --login -c -i 'source ~/.bashrc; ...'\n"
            f"export PATH={shlex.quote(str(self.venv / 'bin'))}:$PATH\n"
            "export RAY_USAGE_STATS_ENABLED=0\n"
            "if [ -f ~/.fakehost_env ]; then . ~/.fakehost_env; fi\n"
        )

    # ------------------------------------------------------------------ Ray cluster config

    def local_cluster_config(
        self,
        cluster_name: str,
        *,
        head: str = "head",
        workers: Sequence[str] | None = None,
        num_cpus: int = 1,
        head_resources: Mapping[str, float] | None = None,
        worker_resources: Mapping[str, float] | None = None,
        auth_mode: str | None = "disabled",
        autoscaler_update_interval_s: int | None = 1,
        worker_gcs_reconnect_timeout_s: int | None = 10,
        workers_exit_with_head: bool = True,
        head_args: Sequence[str] = (),
        worker_args: Sequence[str] = (),
    ) -> dict[str, Any]:
        """A provider-`local` Ray cluster config dict for these hosts.

        workers: worker hosts (default: every host but `head`); all of them are started.
        auth_mode: RAY_AUTH_MODE for both `ray start`s (Ray 2.60 token auth: the head enables
            tokens when ~/.ray/auth_token exists but the default worker command never sends
            one); None leaves Ray's default.
        autoscaler_update_interval_s: head's autoscaler loop period (Ray's default 5 s), lower
            so the worker is launched sooner.
        worker_gcs_reconnect_timeout_s: a worker's raylet exits once the head's GCS is gone
            this long (Ray's default 60 s).
        workers_exit_with_head: `teardown_cluster` only runs `ray stop` on the head for
            provider local; on a worker the raylet then exits (see above), its agents ~60 s
            later (they try to report the raylet's death to the dead GCS), and log_monitor.py
            runs forever (Ray 2.60). With True, each worker also starts a watchdog that runs
            `ray stop` there once the head's GCS port stops answering, like a cloud node that
            is terminated. False: Ray's plain `ray start` (to test a launcher that stops
            workers itself, or Ray's own leftovers).
        head_args, worker_args: extra `ray start` arguments, e.g. "--include-dashboard=false".
        """
        if workers is None:
            workers = [h.name for h in self.hosts if h.name != head]
        head_ip = self.address(head)
        env = f"export RAY_AUTH_MODE={auth_mode}; " if auth_mode else ""
        head_env = env
        if autoscaler_update_interval_s is not None:
            head_env += f"export AUTOSCALER_UPDATE_INTERVAL_S={autoscaler_update_interval_s}; "
        worker_env = env
        if worker_gcs_reconnect_timeout_s is not None:
            worker_env += (
                f"export RAY_gcs_rpc_server_reconnect_timeout_s={worker_gcs_reconnect_timeout_s}; "
            )
        # --node-ip-address: all hosts share one kernel, Ray would register them all as
        # 127.0.0.1. No fixed --object-manager-port (they would collide) and no `ray stop` in
        # the worker commands (FINDINGS items 4 and 9).
        head_start = (
            f"{head_env}ray start --head --port=6379 --node-ip-address={head_ip}"
            f" --num-cpus={num_cpus} --autoscaling-config=~/ray_bootstrap_config.yaml"
            f"{_resources_arg(head_resources)}{_extra_args(head_args)}"
        )
        ray_start = (
            "ray start --address=$RAY_HEAD_IP:6379 --node-ip-address=$FAKEHOST_IP"
            f" --num-cpus={num_cpus}{_resources_arg(worker_resources)}{_extra_args(worker_args)}"
        )
        if workers_exit_with_head:
            # 3 failed connects in a row: the head is gone, not just busy
            watchdog = (
                "n=0; while [ $n -lt 3 ]; do if (exec 3<>/dev/tcp/$0/6379) 2>/dev/null;"
                " then n=0; else n=$((n+1)); fi; sleep 1; done; ray stop"
            )
            ray_start += (
                f" && {{ nohup bash -c {shlex.quote(watchdog)} $RAY_HEAD_IP"
                " >/tmp/ray-worker-watchdog.log 2>&1 </dev/null & }"
            )
        # one command for all workers: each takes its own address from its ssh session
        worker_start = (
            f"export FAKEHOST_IP=$(echo $SSH_CONNECTION | cut -d' ' -f3); {worker_env}{ray_start}"
        )
        return {
            "cluster_name": cluster_name,
            "provider": {
                "type": "local",
                "head_ip": head_ip,
                "worker_ips": [self.address(w) for w in workers],
            },
            "auth": self.auth,
            "min_workers": len(workers),
            "max_workers": len(workers),
            "upscaling_speed": 1.0,
            "idle_timeout_minutes": 5,
            "head_start_ray_commands": ["ray stop", head_start],
            "worker_start_ray_commands": [worker_start],
        }


def _resources_arg(resources: Mapping[str, float] | None) -> str:
    if not resources:
        return ""
    body = ", ".join(f'"{k}": {v}' for k, v in resources.items())
    return " --resources=" + shlex.quote("{" + body + "}")


def _extra_args(args: Sequence[str]) -> str:
    return "".join(" " + shlex.quote(arg) for arg in args)
