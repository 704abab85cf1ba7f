"""Hydra's own launcher conformance suites, run against the `ray` launcher on a
real Ray (one per test session)."""

from collections.abc import Iterator

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)


@pytest.fixture(autouse=True)
def _shared_ray(ray_session: str) -> Iterator[None]:
    yield


@pytest.mark.parametrize("launcher_name, overrides", [("ray", [])])
class TestRayLauncher(LauncherTestSuite):
    pass


@pytest.mark.parametrize(
    "launcher_name, overrides",
    [("ray", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])],
)
class TestRayLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.fixture
def extra_flags(ray_session: str) -> list[str]:
    # Subprocess apps connect to the session's Ray instead of starting their own.
    return ["-m", f"hydra.launcher.ray.init.address={ray_session}"]


@pytest.mark.parametrize(
    "task_launcher_cfg",
    [{"defaults": [{"override hydra/launcher": "ray"}, "_self_"]}],
)
class TestRayLauncherIntegration(IntegrationTestSuite):
    pass
