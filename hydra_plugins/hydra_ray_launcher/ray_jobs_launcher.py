"""The Jobs API launcher (`ray_jobs`): runs a sweep as one Ray job per batch on a
running cluster, through its dashboard alone, and brings every result home."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ._sweep import SweepBook


class RayJobsLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        # The settings are read from the Hydra config given to setup(), as one node.
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        # The sweep's jobs and outcomes across batches (summary, resume).
        self.book: SweepBook | None = None

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
        from . import _jobs_api

        return _jobs_api.launch(self, job_overrides, initial_job_idx)
