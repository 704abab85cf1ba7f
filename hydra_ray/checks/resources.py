"""What each job asks Ray for: `hydra.launcher.ray.remote`, one set for the
whole sweep, or resolved against each job's own config where a value
interpolates into it (`num_gpus: ${model.gpus}`).

A sweep whose `ray.remote` has no interpolation costs nothing here: its options
are read once, and the jobs compose their configs where they run. One that
has them composes each job's config in the process that submits the jobs (the
launching one, or the driver on a cluster's head), job by job as it submits
them, and hands that config to the job, which then does not compose it again.

Ray is imported only where `check_remote_options` asks ray.remote() itself.
"""

import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from hydra_ray.core.errors import ConfigError, ResourceError
from hydra_ray.core.redact import redacting_logger

if TYPE_CHECKING:
    from hydra.types import HydraContext

    from hydra_ray.core.jobs import Job

log = redacting_logger(__name__)

REMOTE_KEY = "hydra.launcher.ray.remote"
# Before Ray starts, the launcher resolves the jobs' options for this long at
# most (in job order): a value that does not resolve for one of them refuses
# the sweep before anything runs. The rest are resolved as they are submitted,
# so a sweep of 10,000 jobs does not wait for 10,000 composes before its first.
AHEAD_S = 2.0


def plain_dict(node: DictConfig) -> dict[str, Any]:
    """A config node as the plain dict Ray's APIs take, interpolations resolved."""
    container = OmegaConf.to_container(node, resolve=True)
    assert isinstance(container, dict)
    return {str(k): v for k, v in container.items()}


def without_nulls(options: Mapping[str, Any]) -> dict[str, Any]:
    """Null means "Ray's default": such keys are not passed to Ray at all."""
    return {k: v for k, v in options.items() if v is not None}


# What ray.remote() takes as a string scheduling_strategy (it checks only at submission).
_SCHEDULING_STRATEGIES = ("DEFAULT", "SPREAD")


def check_remote_options(remote: Mapping[str, Any]) -> dict[str, Any]:
    """The `ray.remote` options of every job's task, checked by ray.remote()
    itself (no Ray needs to run): returns them without nulls. Raises ConfigError."""
    import ray

    options = without_nulls(remote)
    strategy = options.get("scheduling_strategy")
    if isinstance(strategy, str) and strategy not in _SCHEDULING_STRATEGIES:
        raise ConfigError(
            f"hydra.launcher.ray.remote.scheduling_strategy={strategy} is not valid: Ray takes "
            f"{' or '.join(_SCHEDULING_STRATEGIES)} (upper case), or null for Ray's default"
        )
    try:
        ray.remote(_no_op).options(**options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"hydra.launcher.ray.remote is not valid for ray.remote(): {str(exc).rstrip('.')}. "
            "Use the option names and value types of ray.remote()."
        ) from None
    return options


def _no_op() -> None:
    pass


def interpolations(node: DictConfig | ListConfig, prefix: str = REMOTE_KEY) -> Iterator[str]:
    """The full keys of the values under `node` that are interpolations."""
    keys: Sequence[Any] = list(node.keys()) if isinstance(node, DictConfig) else range(len(node))
    for key in keys:
        full = f"{prefix}.{key}"
        if OmegaConf.is_interpolation(node, key):
            yield full
            continue
        child = node._get_node(key)
        if isinstance(child, DictConfig | ListConfig) and not child._is_none():
            yield from interpolations(child, full)


class JobResources:
    """The `ray.remote` options of a batch's jobs.

    `config` is the sweep's config (its `hydra.launcher.ray.remote`, unresolved,
    says whether the options differ per job); `compose(overrides)` composes a
    job's config; `configs`, where given, are the jobs' configs composed already
    (composed elsewhere: they are used instead of composing again)."""

    def __init__(
        self,
        config: DictConfig,
        compose: Callable[[Sequence[str]], DictConfig],
        configs: Mapping[int, DictConfig] | None = None,
    ) -> None:
        node = OmegaConf.select(config, REMOTE_KEY)
        self.interpolated = sorted(interpolations(node)) if node is not None else []
        self._config = config
        self._compose = compose
        self._configs = configs
        # Options and composed configs resolved ahead of submission, by job index.
        self._ahead: dict[int, tuple[dict[str, Any], DictConfig]] = {}
        self.shared: dict[str, Any] | None = None
        if not self.interpolated:
            self.shared = check_remote_options(plain_dict(node)) if node is not None else {}

    @property
    def per_job(self) -> bool:
        return self.shared is None

    def resolve_ahead(self, jobs: "Sequence[Job]") -> None:
        """Resolve the jobs' options in job order for AHEAD_S at most: raises
        ResourceError naming each job whose values do not resolve, before
        anything runs. Resolved options are kept for the submission."""
        problems = self.resolve(jobs, budget_s=AHEAD_S)
        if problems:
            raise ResourceError("\n".join(problems))

    def resolve(self, jobs: "Sequence[Job]", budget_s: float = math.inf) -> list[str]:
        """Resolve the jobs' options in job order, for `budget_s` at most (the
        dry run: all of them), keeping them for the submission; returns why
        each job whose values do not resolve does not."""
        if not self.per_job:
            return []
        deadline = time.monotonic() + budget_s
        problems: list[str] = []
        for job in jobs:
            if time.monotonic() > deadline:
                log.info(
                    f"Resolved {REMOTE_KEY} for {len(self._ahead)} of {len(jobs)} jobs before "
                    "submitting; the others are resolved as they are submitted"
                )
                break
            try:
                self._ahead[job.idx] = self._resolve(job)
            except ResourceError as exc:
                problems.append(str(exc))
        return problems

    def distinct(self, jobs: "Sequence[Job]") -> list[tuple[dict[str, Any], list[int] | None]]:
        """Each distinct set of options with the jobs that ask for it (None: every
        job asks for it), of the jobs resolved so far."""
        if self.shared is not None:
            return [(self.shared, None)]
        groups: dict[str, tuple[dict[str, Any], list[int]]] = {}
        for job in jobs:
            if job.idx in self._ahead:
                options = self._ahead[job.idx][0]
                groups.setdefault(repr(sorted(options.items())), (options, []))[1].append(job.idx)
        return list(groups.values())

    def options(self, job: "Job") -> tuple[dict[str, Any], DictConfig | None]:
        """The job's options for ray.remote(), and its config where it was
        composed for them (the job then does not compose it again). Raises
        ResourceError."""
        if self.shared is not None:
            return self.shared, self._configs[job.idx] if self._configs else None
        ahead = self._ahead.pop(job.idx, None)
        return ahead if ahead is not None else self._resolve(job)

    def _resolve(self, job: "Job") -> tuple[dict[str, Any], DictConfig]:
        def fail(why: str) -> ResourceError:
            overrides = " ".join(job.overrides) or "no overrides"
            return ResourceError(f"Job #{job.idx} ({overrides}): {why}")

        try:
            config = self._configs[job.idx] if self._configs else self._compose(job.overrides)
        except Exception as exc:  # whatever composing raises: named for this job
            raise fail(
                f"its config could not be composed to resolve {REMOTE_KEY}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if self._configs is None:
            with open_dict(config):
                # As the job would compose it where it runs (see `engine.worker._Prepared`).
                config.hydra.runtime.cwd = self._config.hydra.runtime.cwd
        for key in self.interpolated:
            try:
                OmegaConf.select(config, key, throw_on_missing=True)
            except OmegaConfBaseException as exc:
                raise fail(
                    f"{key}={_raw(config, key)} does not resolve in this job's config "
                    f"({type(exc).__name__}: {_first_line(exc)}). Give every job's config "
                    "that value, or a default: ${oc.select:KEY,DEFAULT}"
                ) from None
        node = config.hydra.launcher.ray.remote
        try:
            options = check_remote_options(plain_dict(node))
        except ConfigError as exc:
            raise fail(str(exc)) from None
        return options, config


def _raw(config: DictConfig, full_key: str) -> str:
    """The value of `full_key` as written, its interpolation unresolved."""
    parent_key, _, leaf = full_key.rpartition(".")
    parent = OmegaConf.select(config, parent_key)
    try:
        return str(parent._get_node(leaf)._value())
    except Exception:  # a list index: the key alone says enough
        return "?"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def request(options: Mapping[str, Any]) -> dict[str, float]:
    """What a task with these ray.remote() options asks a node for, as Ray names
    resources ({"CPU": 1, "GPU": 0.5, "memory": ..., custom: ...}), zeros left out."""
    cpus = options.get("num_cpus")
    asked = {
        "CPU": float(1 if cpus is None else cpus),
        "GPU": float(options.get("num_gpus") or 0),
        "memory": float(options.get("memory") or 0),
        **{str(k): float(v) for k, v in (options.get("resources") or {}).items()},
    }
    return {k: v for k, v in asked.items() if v > 0}


def for_sweep(
    hydra_context: "HydraContext",
    config: DictConfig,
    configs: Mapping[int, DictConfig] | None = None,
) -> JobResources:
    """The batch's JobResources in the launching process, whose config loader
    composes the jobs' configs."""
    loader = hydra_context.config_loader
    return JobResources(
        config, lambda overrides: loader.load_sweep_config(config, list(overrides)), configs
    )
