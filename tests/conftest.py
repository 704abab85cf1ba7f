"""Shared fixtures: one real Ray for the whole test session, and a runner for
Hydra apps as subprocesses."""

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


def run_app(
    app: str, *overrides: str, cwd: Path, timeout: float = 180, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run `python tests/apps/<app> --multirun <overrides>` in `cwd`."""
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", "RAY_USAGE_STATS_ENABLED": "0"}
    return subprocess.run(
        [sys.executable, str(APPS / app), "--multirun", *overrides],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, **popen,
    )
