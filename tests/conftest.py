"""Shared fixtures: one real Ray for the whole test session, and a runner for
Hydra apps as subprocesses."""

import os
import subprocess
import sys
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
