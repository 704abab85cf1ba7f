"""Shared fixtures: one real Ray for the whole test session, and runners for
Hydra apps as subprocesses: to the end (`run_app`, `run_in_pty`) or started and
followed as they run (`AppProcess`)."""

import contextlib
import fcntl
import os
import pty
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

APPS = Path(__file__).parent / "apps"

# Small, fast local Rays: no dashboard, 2 CPUs.
SMALL_RAY = [
    "hydra.launcher.ray.init.num_cpus=2",
    "hydra.launcher.ray.init.include_dashboard=false",
]


def pytest_configure(config: pytest.Config) -> None:
    """A Ctrl-C that whatever started the tests ignores (a background job of a
    non-interactive shell, `cmd &`, starts with SIGINT ignored) would be ignored
    by every app the tests start too, as an ignored signal is inherited: the
    tests that press Ctrl-C mean a user's terminal, where it is not ignored."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # The machine's key for sweeps (core.seal), the tests' own, shared with the
    # apps they start: never the user's ~/.local/state.
    os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="hydra-ray-tests-state-")
    config.add_cleanup(lambda: shutil.rmtree(os.environ["XDG_STATE_HOME"], ignore_errors=True))
    # Ray's usage stats off, here and in every app and Ray the tests start (the
    # fake hosts' sshds set it for theirs: tests/cluster_harness).
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"


def sweep_key_of(sweep_dir: Path) -> bytes:
    """The key of the sweep in `sweep_dir` (its id made if it has none), as the
    launcher derives it: what seals its records."""
    from hydra_ray.core.records import RECORD_DIR
    from hydra_ray.core.seal import sweep_key

    return sweep_key(sweep_dir / RECORD_DIR, new=False)


@pytest.fixture(scope="session", autouse=True)
def _hydra_plugins_discovered() -> None:
    """Hydra's plugin scan, once, before any test: its configs (the basic
    sweeper's, ours) are registered at import. Hydra's `hydra_restore_singletons`
    restores the ConfigStore a test started with; had the scan happened inside
    the first test, every later test (on Hydra 1.4) would miss those configs."""
    from hydra.core.plugins import Plugins

    Plugins.instance()


@pytest.fixture(scope="session")
def ray_session() -> Iterator[str]:
    """A Ray started once for the whole test session; yields its address, to
    which subprocess apps connect with hydra.launcher.ray.init.address."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@dataclass
class AppRun:
    returncode: int
    # Hydra logs to stdout, Ray and Python's tracebacks to stderr: a user sees both.
    output: str


def run_app(
    app: str,
    *overrides: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    timeout: float = 180,
) -> AppRun:
    """Run `python tests/apps/<app> --multirun <overrides>` in `cwd`, in this
    process's environment plus `env` and without the variables in `unset`.

    (`unset` matters: the session's `ray.init()` sets RAY_AUTH_MODE=token here.)"""
    args = [str(APPS / app), "--multirun", *overrides]
    return run_python(*args, cwd=cwd, env=env, unset=unset, timeout=timeout)


def run_python(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    timeout: float = 180,
) -> AppRun:
    """Run `python <args>` as `run_app` does (`-m pkg.app --multirun ...`, say)."""
    res = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env=_app_env(env, unset),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )
    return AppRun(res.returncode, res.stdout)


def run_app_in_pty(
    app: str, *overrides: str, cwd: Path, columns: int = 120, timeout: float = 180
) -> AppRun:
    """Run the app as `run_app` does, but on a pseudo-terminal, as a user at a
    terminal would: everything it writes, control sequences included."""
    return run_in_pty(
        [sys.executable, str(APPS / app), "--multirun", *overrides],
        cwd=cwd,
        columns=columns,
        timeout=timeout,
    )


def _app_env(env: dict[str, str] | None, unset: tuple[str, ...]) -> dict[str, str]:
    """This process's environment plus `env`, without the variables in `unset`."""
    return {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}


def run_in_pty(
    cmd: list[str],
    *,
    cwd: Path,
    env: dict[str, str] | None = None,
    columns: int = 120,
    timeout: float = 180,
) -> AppRun:
    """Run `cmd` with a pseudo-terminal `columns` wide as its stdin, stdout and
    stderr (in this process's environment, unless `env`)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**(os.environ if env is None else env), "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # EIO: the app's side of the terminal is closed
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        else:
            proc.kill()
            raise TimeoutError(f"{cmd} did not end within {timeout} s")
    finally:
        os.close(master)
    return AppRun(proc.wait(timeout=30), b"".join(chunks).decode(errors="replace"))


class AppProcess:
    """An app started as a user's terminal starts it: in a session (so a process
    group) of its own, its stdout and stderr (a user sees both) read as they
    come. As a context manager its exit kills the whole group, the app and what
    it started, on every path of the test."""

    def __init__(
        self, cmd: Sequence[str], *, cwd: Path, env: Mapping[str, str] | None = None
    ) -> None:
        """`cmd` in `cwd`, in `env` (this process's environment if None)."""
        self.proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            env=None if env is None else dict(env),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.lines.extend(self.proc.stdout)

    def __enter__(self) -> "AppProcess":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.kill()

    @property
    def pid(self) -> int:
        """The app's pid: the id of its session and of its process group."""
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    @property
    def output(self) -> str:
        """All it has written so far."""
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 120) -> None:
        """Until `text` is in the output; fails if the app exits first or `timeout` passes."""
        self.wait_until(lambda: text in self.output, timeout, repr(text))

    def wait_until(
        self, done: Callable[[], bool], timeout: float = 120, what: str = "the condition"
    ) -> None:
        """Until `done()`, polled while the app runs; fails if the app exits first
        or `timeout` passes."""
        deadline = time.monotonic() + timeout
        while not done():
            assert self.proc.poll() is None, f"exited before {what}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {what} in {timeout} s:\n{self.output}"
            time.sleep(0.2)

    def send(self, sig: int) -> None:
        """`sig` to the app alone (as `kill -SIG PID`)."""
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 120) -> int:
        """The app's exit code, once it has exited and its output is read."""
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def end(self, sig: int, timeout: float = 120) -> str:
        """Send `sig`, wait for the end (the group killed if it does not come in
        `timeout`); the whole output."""
        try:
            self.send(sig)
            self.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.kill_group()
        self._reader.join(timeout=10)
        return self.output

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """`sig` to every process of the app's group (a closed terminal's kill -9)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)

    def kill(self) -> None:
        """The whole group killed, the app reaped: nothing of it left running."""
        self.kill_group()
        self.proc.wait()
        self._reader.join(timeout=10)


def start_app(
    app: str,
    *overrides: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
) -> AppProcess:
    """`python tests/apps/<app> --multirun <overrides>` started as `AppProcess`,
    in the environment `run_app` gives it."""
    return AppProcess(
        [sys.executable, str(APPS / app), "--multirun", *overrides],
        cwd=cwd,
        env=_app_env(env, unset),
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def ray_head(
    env: dict[str, str],
    client_port: int | None = None,
    dashboard_port: int | None = None,
    agent_port: int | None = None,
    temp_dir: str | None = None,
    ray_bin: Path | None = None,
) -> Iterator[tuple[str, int]]:
    """A Ray cluster started with `ray start --head` on this machine (in `env`:
    RAY_AUTH_MODE and HOME decide its token), with a Ray Client server on
    `client_port` if given, by `ray_bin` (another venv's `ray`) or this venv's;
    yields its address and the session id of its processes. Stopped after by
    killing its process group (never `ray stop`, which would stop every Ray on
    the machine)."""
    port = free_port()
    client = [f"--ray-client-server-port={client_port}"] if client_port else []
    dashboard = ["--include-dashboard=false"]
    if dashboard_port:
        # The agents' ports too: Ray's defaults are fixed numbers, which the
        # session's own Ray already holds ("No available agent to submit job").
        dashboard = [
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard_port}",
            f"--dashboard-agent-listen-port={agent_port or free_port()}",
            f"--dashboard-agent-grpc-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
        ]
    # A short, private temp dir: Ray's socket paths must stay short, and its
    # record of "the latest cluster" must not leak to other tests. A caller
    # that reads the head's logs after passes its own and removes it.
    own_temp = temp_dir is None
    temp_dir = temp_dir or tempfile.mkdtemp(prefix="rc", dir="/tmp")
    head = subprocess.Popen(
        [
            str(ray_bin or Path(sys.executable).parent / "ray"),
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            f"--temp-dir={temp_dir}",
            *dashboard,
            *client,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", dashboard_port or client_port or port)) == 0:
                    break
            assert head.poll() is None and time.monotonic() < deadline, "ray start failed"
            time.sleep(0.5)
        # `ray start` says where it runs (for `ray.init()` with no address) last,
        # once its processes (the raylet too) have started.
        said = Path(temp_dir) / "ray_current_cluster"
        while not said.exists():
            assert head.poll() is None and time.monotonic() < deadline + 60, "ray start failed"
            time.sleep(0.5)
        yield f"localhost:{port}", head.pid
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops its processes
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=5)  # then SIGKILL: its temp dir is its own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)  # and whatever did not stop in time
        # Until they are gone: a Ray process still exiting makes its log dirs again.
        gone_by = time.monotonic() + 10
        while processes_in_session(head.pid) and time.monotonic() < gone_by:
            time.sleep(0.2)
        if own_temp:
            shutil.rmtree(temp_dir, ignore_errors=True)


def processes_in_session(sid: int) -> list[str]:
    """Live processes of a session (zombies excluded: they are gone, only unreaped)."""
    ps = subprocess.run(
        ["ps", "-e", "-ww", "-o", "pid=,sid=,stat=,args="], capture_output=True, text=True
    )
    rows = [line.split(None, 3) for line in ps.stdout.splitlines()]
    return [" ".join(r) for r in rows if len(r) == 4 and int(r[1]) == sid and "Z" not in r[2]]


# Hydra's Optuna sweeper and what Optuna needs that this venv lacks, in a dir of
# their own: on the launching process's PYTHONPATH only. The cluster has neither,
# as a user's cluster often has not (the sweeper runs on the launching machine).
OPTUNA = (
    "hydra-optuna-sweeper==1.3.0",
    "optuna==2.10.1",
    *("cmaes", "scipy", "numpy", "sqlalchemy", "alembic", "colorlog", "tqdm", "Mako"),
)


@pytest.fixture(scope="session")
def optuna_sweeper() -> Path:
    target = Path(sys.prefix) / "optuna-sweeper"
    done = target / "installed"
    if not done.is_file():
        shutil.rmtree(target, ignore_errors=True)
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target"]
        subprocess.run([*cmd, str(target), *OPTUNA], check=True, timeout=600)
        done.write_text("\n".join(OPTUNA))
    return target
