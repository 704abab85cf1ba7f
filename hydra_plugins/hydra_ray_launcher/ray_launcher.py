"""The `ray` launcher: each job of a sweep is a Ray task, on a local Ray or on a
running cluster (`hydra.launcher.ray.init.address`)."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ._engine import ShippedState
    from ._sweep import SweepBook


class RayLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        # The settings are read from the Hydra config given to setup(), as one node.
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        # The sweep state in Ray's object store, shipped at the first launch()
        # and reused by the next batches.
        self.shipped: ShippedState | None = None
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
        from . import _local

        return _local.launch(self, job_overrides, initial_job_idx)
