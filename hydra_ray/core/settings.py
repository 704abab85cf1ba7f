"""`hydra.launcher`, read once: the launch skeleton (`launch.skeleton`) turns
the sweep's config node into these frozen dataclasses, and every module below
it takes them instead of the node.

The defaults are the face's (`hydra_plugins.hydra_ray_launcher._config`), and
only there: a key is read as the config holds it, never with a second
default. Nothing is coerced either: the checks (`checks.*`) say which values
cannot work, naming the key. Mappings handed to Ray as they are (`ray.init`,
`ray.cluster`, a `runtime_env`, the headers) are plain dicts, resolved.
`ray.remote` stays the config node: it may interpolate into each job's own
config, so it is resolved per job (`checks.resources`). The values that may
hold secrets (a token, credentials in a URI or an env var) are left out of the
settings' repr. No Ray here."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hydra_ray.core.errors import ConfigError
from hydra_ray.core.jobs import Policy


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _texts(value: Any) -> list[str]:
    return [str(v) for v in value or ()]


def _plain(value: Any) -> Any:
    """A config value as Python data: containers become dicts and lists."""
    if OmegaConf.is_config(value):
        return OmegaConf.to_container(value, resolve=True)
    return value


@dataclass(frozen=True)
class SyncUp:
    """hydra.launcher.sync_up: the code that goes to the cluster."""

    # The local dir to send; None: nothing.
    source_dir: str | None
    # Where it goes on the head (the cluster launchers'); None: Ray's default.
    target_dir: str | None
    # rsync's filters (includes tried first, the first match wins).
    include: list[str]
    exclude: list[str]

    @classmethod
    def of(cls, node: Any) -> "SyncUp":
        return cls(
            source_dir=_text(node.source_dir),
            target_dir=_text(node.get("target_dir")),
            include=_texts(node.include),
            exclude=_texts(node.exclude),
        )


@dataclass(frozen=True)
class SyncDown:
    """hydra.launcher.sync_down: what of the cluster's files comes home, and where."""

    # The local dir the outputs come to; None: the local sweep dir.
    target_dir: Path | None
    # rsync's filters (includes tried first, the first match wins).
    include: list[str]
    exclude: list[str]
    # Where the driver also puts its pack (a URI that may hold credentials).
    storage: str | None = field(repr=False)
    # The cluster launchers': the dir on the head whose files come home, when
    # not the sweep dir; None: the sweep dir.
    source_dir: str | None = None

    @classmethod
    def of(cls, node: Any) -> "SyncDown":
        target = _text(node.target_dir)
        return cls(
            target_dir=None if target is None else Path(target),
            include=_texts(node.include),
            exclude=_texts(node.exclude),
            storage=_text(node.storage),
            source_dir=_text(node.get("source_dir")),
        )

    @property
    def filtered(self) -> bool:
        return bool(self.include or self.exclude)

    def target(self, sweep_dir: Path) -> Path:
        """The local dir the files come to."""
        return self.target_dir if self.target_dir is not None else sweep_dir

    def home(self, sweep_dir: Path) -> Path | None:
        """Where the sweep dir's outputs come home; None if another dir does."""
        return None if self.source_dir is not None else self.target(sweep_dir)


@dataclass(frozen=True)
class Settings:
    """hydra.launcher: the keys of every launcher (the `ray` launcher's all)."""

    # The keys that shape a sweep's run (see the face's SweepRunConf).
    progress: bool
    resume: bool
    dry_run: bool
    retries: int
    job_timeout_s: float | None
    max_concurrent_jobs: int | None
    stop_grace_s: float
    retry_timed_out: bool
    # hydra.launcher.ray.init, resolved (nulls kept: "Ray's default").
    ray_init: dict[str, Any] = field(repr=False)
    # hydra.launcher.ray.remote, the config node (resolved per job).
    ray_remote: DictConfig

    @property
    def policy(self) -> Policy:
        """How the engine treats failing and slow jobs (checked: `checks.validate`)."""
        timeout, cap = self.job_timeout_s, self.max_concurrent_jobs
        return Policy(
            retries=int(self.retries),
            job_timeout_s=None if timeout is None else float(timeout),
            max_concurrent_jobs=None if cap is None else int(cap),
            stop_grace_s=float(self.stop_grace_s),
            retry_timed_out=bool(self.retry_timed_out),
        )

    @staticmethod
    def of(node: DictConfig) -> "Settings":
        """The settings of a launcher's config node (`hydra.launcher`), of the
        class of its launcher. Raises ConfigError naming the key whose value
        cannot be read (an interpolation that does not resolve)."""
        kind: type[Settings] = Settings
        if "stop_cluster" in node:
            kind = ClusterSettings
        elif "entrypoint_python" in node:
            kind = JobsSettings
        try:
            return kind(**kind._read(node))
        except OmegaConfBaseException as exc:
            key = str(getattr(exc, "full_key", None) or "")
            if not key.startswith("hydra."):
                key = f"hydra.launcher.{key}".rstrip(".")
            raise ConfigError(
                f"{key} cannot be read: {_first_line(exc)}. Fix its value (or the "
                "interpolation in it)."
            ) from None

    @classmethod
    def _read(cls, node: Any) -> dict[str, Any]:
        return {
            "progress": node.progress,
            "resume": node.resume,
            "dry_run": node.dry_run,
            "retries": node.retries,
            "job_timeout_s": node.job_timeout_s,
            "max_concurrent_jobs": node.max_concurrent_jobs,
            "stop_grace_s": node.stop_grace_s,
            "retry_timed_out": node.retry_timed_out,
            "ray_init": _plain(node.ray.init),
            "ray_remote": node.ray.remote,
        }


@dataclass(frozen=True)
class DetachedSettings(Settings):
    """The keys of the launchers whose sweep runs in a driver on the cluster,
    which send code and bring files home (the cluster launchers, `ray_jobs`)."""

    sync_up: SyncUp
    sync_down: SyncDown
    # How long a lost connection to the cluster is made again.
    reconnect_s: float

    @classmethod
    def _read(cls, node: Any) -> dict[str, Any]:
        return {
            **super()._read(node),
            "sync_up": SyncUp.of(node.sync_up),
            "sync_down": SyncDown.of(node.sync_down),
            "reconnect_s": node.reconnect_s,
        }


@dataclass(frozen=True)
class ClusterSettings(DetachedSettings):
    """The keys of the cluster launchers (`ray_aws`, `ray_cluster`)."""

    # A Ray cluster YAML file, the base that `cluster` goes on top of.
    cluster_yaml: str | None
    # hydra.launcher.ray.cluster, resolved (nulls kept: "Ray's default").
    cluster: dict[str, Any] = field(repr=False)
    run_env: str
    # hydra.launcher.env_setup.
    setup_commands: list[str]
    pip_packages: dict[str, Any]
    stop_cluster: bool
    autodown_minutes: float | None
    # hydra.launcher.logging: Ray's cli_logger.
    log_style: str
    color_mode: str
    verbosity: int
    # hydra.launcher.create_update_cluster.
    no_restart: bool
    restart_only: bool
    no_config_cache: bool
    # hydra.launcher.teardown_cluster.
    workers_only: bool
    keep_min_workers: bool

    @classmethod
    def _read(cls, node: Any) -> dict[str, Any]:
        create, teardown = node.create_update_cluster, node.teardown_cluster
        return {
            **super()._read(node),
            "cluster_yaml": _text(node.get("cluster_yaml")),
            "cluster": _plain(node.ray.cluster),
            "run_env": node.ray.run_env,
            "setup_commands": _texts(node.env_setup.commands),
            "pip_packages": _plain(node.env_setup.pip_packages),
            "stop_cluster": node.stop_cluster,
            "autodown_minutes": node.autodown_minutes,
            "log_style": node.logging.log_style,
            "color_mode": node.logging.color_mode,
            "verbosity": node.logging.verbosity,
            "no_restart": create.no_restart,
            "restart_only": create.restart_only,
            "no_config_cache": create.no_config_cache,
            "workers_only": teardown.workers_only,
            "keep_min_workers": teardown.keep_min_workers,
        }


@dataclass(frozen=True)
class JobsSettings(DetachedSettings):
    """The keys of the `ray_jobs` launcher: its dashboard and its Ray job."""

    address: str | None
    # A mapping of header names to values, as given (checked: `infra.dashboard`).
    headers: Any = field(repr=False)
    # True, false or a CA bundle's path, as given (checked there too).
    verify: Any
    token_over_http: bool
    runtime_env: dict[str, Any] | None = field(repr=False)
    entrypoint_python: str | None
    entrypoint_num_cpus: float | None
    entrypoint_num_gpus: float | None
    entrypoint_memory: int | None
    entrypoint_resources: dict[str, Any] | None
    stop_wait_s: float
    agent_wait_s: float

    @classmethod
    def _read(cls, node: Any) -> dict[str, Any]:
        return {
            **super()._read(node),
            "address": _text(node.address),
            "headers": _plain(node.headers),
            "verify": node.verify,
            "token_over_http": node.token_over_http,
            "runtime_env": _plain(node.runtime_env),
            "entrypoint_python": _text(node.entrypoint_python),
            "entrypoint_num_cpus": node.entrypoint_num_cpus,
            "entrypoint_num_gpus": node.entrypoint_num_gpus,
            "entrypoint_memory": node.entrypoint_memory,
            "entrypoint_resources": _plain(node.entrypoint_resources),
            "stop_wait_s": node.stop_wait_s,
            "agent_wait_s": node.agent_wait_s,
        }


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
