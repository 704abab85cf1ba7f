"""The Jobs API launcher (`ray_jobs`): runs a sweep as one Ray job per batch on a
running cluster, through its dashboard alone, and brings every result home."""

from collections.abc import Sequence

from hydra.core.utils import JobReturn

from ._launcher import RayLauncherBase


class RayJobsLauncher(RayLauncherBase):
    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from hydra_ray.launch import skeleton
        from hydra_ray.launch.jobs_api import ThroughDashboard

        return skeleton.launch(ThroughDashboard(), self.ready(), job_overrides, initial_job_idx)
