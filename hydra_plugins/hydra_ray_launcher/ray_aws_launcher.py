"""The cluster launcher (`ray_aws`, `ray_cluster`): creates or updates a cluster
with Ray's cluster launcher, runs the sweep there, brings every job's outputs
home, and tears the cluster down."""

import atexit
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ._cluster import Cluster
    from ._sweep import SweepBook


class RayAWSLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        # The settings are read from the Hydra config given to setup(), as one node.
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        # The plain dict Ray's cluster launcher gets, checked at the first launch().
        self.cluster_config: dict[str, Any] | None = None
        # The sweep's jobs and outcomes across batches (summary, resume).
        self.book: SweepBook | None = None
        # One cluster per multirun: created at the first launch(), reused by the
        # next batches, torn down when the process ends (or on an error, at once).
        self._cluster: Cluster | None = None
        self._lifecycle = ExitStack()

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        # Lazy import: Hydra imports this module at every start of every app.
        from . import _remote

        try:
            return _remote.launch(self, job_overrides, initial_job_idx)
        except BaseException:
            self.close()
            raise

    def cluster(self, config_file: Path) -> "Cluster":
        """The multirun's cluster, created at the first call."""
        if self._cluster is None:
            from ._cluster import cluster_session

            assert self.config is not None and self.cluster_config is not None
            atexit.register(self.close)
            self._cluster = self._lifecycle.enter_context(
                cluster_session(self.config.hydra.launcher, self.cluster_config, config_file)
            )
        return self._cluster

    def close(self) -> None:
        """Tear down (or keep, as configured) the cluster this launcher created."""
        self._cluster = None
        self._lifecycle.close()
