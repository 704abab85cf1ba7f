"""Shared fixtures: one real Ray for the whole test session, and a runner for
Hydra apps as subprocesses."""

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

APPS = Path(__file__).parent / "apps"

# Small, fast local Rays: no dashboard, 2 CPUs.
SMALL_RAY = [
    "hydra.launcher.ray.init.num_cpus=2",
    "hydra.launcher.ray.init.include_dashboard=false",
]


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
    app: str, *overrides: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 180
) -> AppRun:
    """Run `python tests/apps/<app> --multirun <overrides>` in `cwd`."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", **(env or {})}
    res = subprocess.run(
        [sys.executable, str(APPS / app), "--multirun", *overrides],
        cwd=cwd,
        env=env,
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
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        columns=columns,
        timeout=timeout,
    )


def run_in_pty(
    cmd: list[str], *, cwd: Path, env: dict[str, str], columns: int = 120, timeout: float = 180
) -> AppRun:
    """Run `cmd` with a pseudo-terminal `columns` wide as its stdin, stdout and stderr."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env={**env, "TERM": "xterm-256color"},
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
