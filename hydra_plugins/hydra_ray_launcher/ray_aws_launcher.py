"""The cluster launcher (`ray_aws`, `ray_cluster`): creates or updates a cluster
with Ray's cluster launcher, runs the sweep there, brings every job's outputs
home, and tears the cluster down."""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ._cluster import ClusterLifetime
    from ._sweep import SweepBook


class RayAWSLauncher(Launcher):
    def __init__(self, **settings: Any) -> None:
        # The settings are read from the Hydra config given to setup(), as one node.
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None
        self.config: DictConfig | None = None
        # The sweep's jobs and outcomes across batches (summary, resume).
        self.book: SweepBook | None = None
        # The multirun's one cluster, made at the first launch() (see _cluster.py).
        self.lifetime: ClusterLifetime | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.hydra_context = hydra_context
        self.task_function = task_function
        self.config = config
        callbacks = hydra_context.callbacks.callbacks
        if not any(isinstance(c, _CloseAtMultirunEnd) for c in callbacks):
            callbacks.append(_CloseAtMultirunEnd(self))

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

    def close(self) -> None:
        """Tear down (or keep, as configured) the cluster this launcher created."""
        if self.lifetime is not None:
            self.lifetime.close()


class _CloseAtMultirunEnd(Callback):
    """Hydra calls on_multirun_end once the sweeper is done with every batch:
    the cluster goes then, while Python is fully alive (Ray's teardown of a
    docker cluster uses a thread pool, refused once the interpreter exits)."""

    def __init__(self, launcher: RayAWSLauncher) -> None:
        self._launcher = launcher

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            self._launcher.close()
        except Exception as exc:  # Hydra would only warn, and the run would exit 0
            raise SystemExit(f"Tearing down the cluster failed: {exc}") from exc

    def __reduce__(self) -> tuple[type[Callback], tuple[()]]:
        # Hydra's context travels with the job spec to the jobs: a no-op there.
        return (Callback, ())
