"""The cluster launcher (`ray_aws`, `ray_cluster`): creates or updates a cluster
with Ray's cluster launcher, runs the sweep there, brings every job's outputs
home, and tears the cluster down."""

from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from ._launcher import RayLauncherBase


class RayAWSLauncher(RayLauncherBase):
    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        callbacks = hydra_context.callbacks.callbacks
        if not any(isinstance(c, _CloseAtMultirunEnd) for c in callbacks):
            callbacks.append(_CloseAtMultirunEnd(self))

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra_ray.launch import skeleton
        from hydra_ray.launch.cluster import OnCluster

        try:
            return skeleton.launch(OnCluster(), self.ready(), job_overrides, initial_job_idx)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Tear down (or keep, as configured) the cluster this launcher created."""
        if self.session is not None and self.session.lifetime is not None:
            self.session.lifetime.close()


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
