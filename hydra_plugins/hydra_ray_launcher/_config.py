"""Structured configs of the launchers, registered in Hydra's ConfigStore when
Hydra scans its plugins.

Hydra imports this module at every start of every app (plugin discovery), so it
imports nothing heavy: no ray, no boto3.
"""

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore


@dataclass
class RayInitConf:
    """Arguments of `ray.init()`. Null means Ray's own default; add any other
    argument of `ray.init()` with `+hydra.launcher.ray.init.NAME=VALUE`."""

    # null: Ray's own resolution (RAY_ADDRESS, else a new local Ray);
    # "HOST:PORT" or "auto": connect to a running cluster.
    address: str | None = None
    # Resources of the local Ray this launcher starts (ignored, with a warning,
    # when connecting to an existing cluster: that cluster's own resources apply).
    num_cpus: int | None = None
    num_gpus: int | None = None
    # Reservable memory of the local node in bytes (Ray's `_memory`).
    memory: int | None = None
    object_store_memory: int | None = None
    resources: dict[str, float] | None = None
    labels: dict[str, str] | None = None
    include_dashboard: bool | None = None
    dashboard_host: str | None = None
    dashboard_port: int | None = None
    namespace: str | None = None
    runtime_env: dict[str, Any] | None = None
    log_to_driver: bool | None = None
    logging_level: str | None = None


@dataclass
class RayRemoteConf:
    """Options of `ray.remote()` for every job's task. Null means Ray's own
    default; add any other option with `+hydra.launcher.ray.remote.NAME=VALUE`."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    # Memory a job reserves, in bytes; Ray schedules no more jobs on a node
    # than its memory allows.
    memory: int | None = None
    resources: dict[str, float] | None = None
    accelerator_type: str | None = None
    # Times Ray runs a job again when its worker process or node dies.
    max_retries: int | None = None
    # Also run a job again when it raises (true, or a list of exception names).
    retry_exceptions: Any = None
    runtime_env: dict[str, Any] | None = None
    # "DEFAULT" or "SPREAD" (spread jobs over the nodes of a cluster).
    scheduling_strategy: str | None = None
    label_selector: dict[str, str] | None = None


@dataclass
class RayConf:
    init: RayInitConf = field(default_factory=RayInitConf)
    remote: RayRemoteConf = field(default_factory=RayRemoteConf)


@dataclass
class RayLauncherConf:
    _target_: str = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    ray: RayConf = field(default_factory=RayConf)


def register_configs() -> None:
    """Store the launchers' configs in Hydra's ConfigStore (group hydra/launcher)."""
    store = ConfigStore.instance()
    store.store(group="hydra/launcher", name="ray", node=RayLauncherConf, provider="ray_launcher")
