"""The lifecycle of a cluster made by Ray's cluster launcher (`ray.autoscaler.sdk`):
one context manager whose exit tears down what its entry created, on every path.

Ray is imported inside functions: Hydra imports this package at every start.
"""

import logging
import shlex
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import yaml
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Cluster:
    """A running cluster, as its config identifies it to Ray's SDK."""

    config: dict[str, Any]
    run_env: str

    def run(self, cmd: str, *, with_output: bool = False) -> str:
        """Run a shell command on the head; its output streams to this terminal,
        or is returned with `with_output`. Raises if the command fails."""
        from ray.autoscaler import sdk

        out = sdk.run_on_cluster(
            self.config, cmd=cmd, run_env=self.run_env, with_output=with_output
        )
        if isinstance(out, bytes):
            return out.decode(errors="replace")
        return out or ""

    def rsync_up(self, source: str, target: str) -> None:
        from ray.autoscaler import sdk

        sdk.rsync(self.config, source=source, target=target, down=False)

    def rsync_down(self, source: str, target: str) -> None:
        from ray.autoscaler import sdk

        sdk.rsync(self.config, source=source, target=target, down=True)


def _raise_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def cluster_session(
    launcher: DictConfig, cluster_config: dict[str, Any], config_file: Path
) -> Iterator[Cluster]:
    """Create or update the cluster, yield it, and on exit tear it down
    (`stop_cluster=true`) or say how to (`stop_cluster=false`), whatever happened
    in between: an error, a failed job, Ctrl-C or SIGTERM."""
    from ray.autoscaler import sdk

    sdk.configure_logging(
        log_style=launcher.logging.log_style,
        color_mode=str(launcher.logging.color_mode).lower(),
        verbosity=launcher.logging.verbosity,
    )
    name = cluster_config.get("cluster_name", "default")
    # SIGTERM would end the process without running this exit: make it an exception.
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    config_file.parent.mkdir(parents=True, exist_ok=True)
    config_file.write_text(yaml.safe_dump(cluster_config, sort_keys=False))
    try:
        opts = launcher.create_update_cluster
        log.info(
            f"Creating or updating cluster {name!r} (no_restart={opts.no_restart}, "
            f"restart_only={opts.restart_only}, no_config_cache={opts.no_config_cache})"
        )
        # The written file, not the dict: Ray's own hints ("ray down ...") then name
        # a file that exists.
        sdk.create_or_update_cluster(
            str(config_file),
            no_restart=opts.no_restart,
            restart_only=opts.restart_only,
            no_config_cache=opts.no_config_cache,
        )
        yield Cluster(config=cluster_config, run_env=launcher.ray.run_env)
    finally:
        try:
            _stop_or_keep(launcher, cluster_config, config_file)
        finally:
            signal.signal(signal.SIGTERM, previous)


def _stop_or_keep(launcher: DictConfig, cluster_config: dict[str, Any], config_file: Path) -> None:
    from ray.autoscaler import sdk

    name = cluster_config.get("cluster_name", "default")
    down = f"ray down -y {shlex.quote(str(config_file.resolve()))}"
    if not launcher.stop_cluster:
        log.warning(
            f"Cluster {name!r} keeps running (stop_cluster=false) and costs money until "
            f"it is torn down: {down}"
        )
        return
    teardown = launcher.teardown_cluster
    cached = bool(cluster_config.get("provider", {}).get("cache_stopped_nodes", False))
    log.info(
        f"Stopping cluster {name!r} now (stop_cluster=true, "
        f"workers_only={teardown.workers_only}, keep_min_workers={teardown.keep_min_workers})"
    )
    try:
        sdk.teardown_cluster(
            str(config_file),
            workers_only=teardown.workers_only,
            keep_min_workers=teardown.keep_min_workers,
        )
    except BaseException:
        log.error(f"Tearing down cluster {name!r} failed: run `{down}` to stop paying for it")
        raise
    what = "Stopped the nodes of" if cached else "Deleted"
    log.info(f"{what} the cluster (provider.cache_stopped_nodes={str(cached).lower()})")
