"""The `ray` launcher: each job of a sweep is a Ray task, on a local Ray or on a
running cluster (`hydra.launcher.ray.init.address`)."""

from collections.abc import Sequence

from hydra.core.utils import JobReturn

from ._launcher import RayLauncherBase


class RayLauncher(RayLauncherBase):
    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra_ray.launch import skeleton
        from hydra_ray.launch.local import Local

        return skeleton.launch(Local(), self.ready(), job_overrides, initial_job_idx)
