"""The `ray_jobs` launcher's own checks: its dashboard's keys (the address,
headers, verify, a token file), the waits after Ctrl-C, sync_up's rsync;
with the sweep's (`checks.validate`), everything refused before an upload."""

import math
import shutil

from hydra_ray.checks.validate import reconnect_problems, source_dir_problems, sweep_problems
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.settings import JobsSettings
from hydra_ray.infra.dashboard import dashboard_for
from hydra_ray.infra.storage import storage_problems


def jobs_problems(settings: JobsSettings) -> list[ConfigError]:
    """What the ray_jobs launcher refuses before anything is uploaded."""
    return sweep_problems(settings) + dashboard_problems(settings)


def dashboard_problems(settings: JobsSettings) -> list[ConfigError]:
    """The ray_jobs launcher's own keys that cannot work: the address, sync_up."""
    problems: list[ConfigError] = []
    try:
        dashboard_for(settings)
    except ConfigError as exc:
        problems.append(exc)
    wait = settings.agent_wait_s
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
        problems.append(
            ConfigError(
                f"hydra.launcher.agent_wait_s={wait} is not valid: set it to the seconds to "
                "wait for the cluster's job agent to come up (a finite number >= 0)"
            )
        )
    problems += reconnect_problems(settings)
    stop_wait, grace = settings.stop_wait_s, settings.stop_grace_s
    numbers = isinstance(grace, (int, float)) and isinstance(stop_wait, (int, float))
    if numbers and stop_wait < grace + 5:
        problems.append(
            ConfigError(
                f"hydra.launcher.stop_wait_s={stop_wait} is too short for "
                f"hydra.launcher.stop_grace_s={grace}: after Ctrl-C, Ray kills the sweep's "
                "driver stop_wait_s after it stops it, before its jobs' grace to save their "
                "work has ended and before it packs what finished. Set stop_wait_s to at "
                f"least {grace + 5:g} (stop_grace_s + 5), or lower stop_grace_s"
            )
        )
    source_dir = settings.sync_up.source_dir
    problems += source_dir_problems(source_dir)
    problems += storage_problems(settings.sync_down.storage)
    if source_dir is not None and shutil.which("rsync") is None:
        problems.append(
            ConfigError("rsync not found on PATH: sync_up filters with it. Install it.")
        )
    return problems
