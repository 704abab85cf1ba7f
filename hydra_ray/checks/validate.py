"""Checks of the user's launcher config that run before anything is started, and
the cluster config Ray's cluster launcher gets from it.

Ray is imported inside functions only, where it is needed."""

import copy
import importlib
import logging
import math
import os
import re
import secrets
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hydra_ray.checks.resources import check_remote_options, plain_dict, without_nulls
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.redact import redacting_logger
from hydra_ray.core.settings import (
    ClusterSettings,
    DetachedSettings,
    Settings,
)

log = redacting_logger(__name__)

# ray.init() arguments that size a new local Ray; Ray refuses them when it
# connects to a running cluster, whose own resources apply.
_NODE_RESOURCE_KEYS = (
    "num_cpus",
    "num_gpus",
    "memory",
    "object_store_memory",
    "resources",
    "labels",
)


def ray_init_kwargs(init: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments for `ray.init()` from `hydra.launcher.ray.init`."""
    kwargs = without_nulls(init)
    address = kwargs.get("address")
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address and address is not None and address != env_address:
        log.warning(
            f"RAY_ADDRESS={env_address} is set: ray.init() connects there, not to "
            f"hydra.launcher.ray.init.address={address}. Unset RAY_ADDRESS to use the key."
        )
        address = env_address
    if address not in (None, "local"):
        ignored = [k for k in _NODE_RESOURCE_KEYS if k in kwargs]
        for key in ignored:
            log.warning(
                f"hydra.launcher.ray.init.{key}={kwargs.pop(key)} is ignored: connecting to "
                f"the running cluster at {address}, whose own resources apply (set them with "
                "`ray start`; per-job resources go in hydra.launcher.ray.remote)"
            )
    if "memory" in kwargs:
        # ray.init() calls the node's reservable memory `_memory`.
        kwargs["_memory"] = kwargs.pop("memory")
    return kwargs


# ---- Every launcher: the keys that shape a sweep's run ----


def settings_problems(settings: Settings) -> list[ConfigError]:
    """`retries`, `job_timeout_s` and `max_concurrent_jobs` values that cannot work."""
    problems = []
    retries = settings.retries
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        problems.append(
            ConfigError(
                f"hydra.launcher.retries={retries} is not valid: set it to 0 (no retries, the "
                "default) or to how many more times a job that raises may run (a whole number)"
            )
        )
    timeout = settings.job_timeout_s
    # NaN passes `<= 0` and never expires (the driver would busy-loop); no limit
    # is null, one way to say it.
    if timeout is not None and (
        not isinstance(timeout, (int, float)) or not math.isfinite(timeout) or timeout <= 0
    ):
        problems.append(
            ConfigError(
                f"hydra.launcher.job_timeout_s={timeout} is not valid: set it to the seconds a "
                "job may run before it is cancelled (a finite number > 0), or to null for no "
                "limit" + (" (not inf)" if timeout == math.inf else "")
            )
        )
    grace = settings.stop_grace_s
    if not isinstance(grace, (int, float)) or not math.isfinite(grace) or grace < 0:
        problems.append(
            ConfigError(
                f"hydra.launcher.stop_grace_s={grace} is not valid: set it to the seconds a job "
                "past its timeout has to save its work before it is cancelled by force (a "
                "finite number >= 0; 0: cancel at once)"
            )
        )
    cap = settings.max_concurrent_jobs
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        problems.append(
            ConfigError(
                f"hydra.launcher.max_concurrent_jobs={cap} is not valid: set it to how many "
                "jobs may run at once (a whole number >= 1), or to null for as many as the "
                "cluster's resources allow"
            )
        )
    return problems


def sweep_problems(settings: Settings) -> list[ConfigError]:
    """What every launcher refuses before Ray starts: the settings, and
    `ray.remote` options that ray.remote() refuses."""
    problems = settings_problems(settings)
    try:
        check_remote_options(plain_dict(settings.ray_remote))
    except ConfigError as exc:
        problems.append(exc)
    except OmegaConfBaseException:
        pass  # it interpolates into each job's own config: checked per job (checks.resources)
    return problems


def source_dir_problems(source_dir: Any) -> list[ConfigError]:
    """A `sync_up.source_dir` that is not a directory (null: nothing to send)."""
    if source_dir is None:
        return []
    source = Path(str(source_dir)).expanduser().absolute()
    if source.is_dir():
        return []
    return [
        ConfigError(
            f"hydra.launcher.sync_up.source_dir={source_dir}: {source} is not a "
            "directory. Give a directory relative to the working dir or absolute, or "
            "null to upload nothing."
        )
    ]


def refuse(problems: list[ConfigError]) -> None:
    """All the problems in one error, so that one run shows every fix to make.
    Raises ConfigError if there is any."""
    if problems:
        raise ConfigError("\n".join(str(p) for p in problems))


# ---- The cluster launchers (`ray_aws`, `ray_cluster`) ----

_CLUSTER_KEY = "hydra.launcher.ray.cluster"
# Keys of Ray's old cluster config that the guide still lists; current Ray's
# schema rejects them ("Additional properties are not allowed").
_LEGACY_CLUSTER_KEYS = ("initial_workers", "autoscaling_mode", "target_utilization_fraction")
_LOGGING_CHOICES = {
    "log_style": ("auto", "pretty", "record"),
    "color_mode": ("auto", "true", "false"),
}
_RUN_ENVS = ("auto", "host", "docker")
_CLUSTER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")
# A year: longer is no teardown at all (null says that), and the watchdog's shell
# arithmetic overflows on the seconds of values such as 1e17.
_MAX_AUTODOWN_MINUTES = 525_600


def cluster_config_for_ray(settings: ClusterSettings) -> dict[str, Any]:
    """The plain dict given to Ray's cluster launcher, from `hydra.launcher`.

    The file of `cluster_yaml` (if set) is the base; the keys of `ray.cluster`
    go on top (dicts merged key by key, anything else replaced; a null key
    keeps the file's value or leaves Ray's default). Then:

    - null values are dropped at every level, and empty top-level sections
      (`provider: {}`, `file_mounts: {}`, ...): both mean "Ray's default";
    - the legacy keys initial_workers, autoscaling_mode and
      target_utilization_fraction are dropped with a warning;
    - a `docker` section without an image is dropped: docker is off (Ray's
      create crashes on `docker: {image: ''}` without a container_name);
    - `setup_commands` becomes env_setup.commands, then one `pip install` per
      env_setup.pip_packages entry, then the user's own setup_commands.

    Pure: `settings` is not changed, so calling it again gives the same dict.
    Raises ConfigError if cluster_yaml cannot be read.
    """
    base = _load_cluster_yaml(settings.cluster_yaml)
    ours = copy.deepcopy(settings.cluster)
    for key in _LEGACY_CLUSTER_KEYS:
        if base.pop(key, None) is not None:
            _warn_legacy(f"{key} in hydra.launcher.cluster_yaml", key)
        value = ours.pop(key, None)
        if value is not None:
            _warn_legacy(f"{_CLUSTER_KEY}.{key}={value}", key)
    cluster: dict[str, Any] = {
        key: value for key, value in _without_nulls_deep(_merged(base, ours)).items() if value != {}
    }
    docker = cluster.get("docker")
    if isinstance(docker, dict) and not any(
        docker.get(k) for k in ("image", "head_image", "worker_image")
    ):
        del cluster["docker"]
    cluster["setup_commands"] = [
        *settings.setup_commands,
        *_pip_commands(settings.pip_packages),
        *cluster.get("setup_commands", []),
    ]
    return cluster


def check_provider_access(cluster: Mapping[str, Any]) -> None:
    """Refuse, before anything is created, a cloud provider this machine cannot
    reach: for AWS, boto3 missing (Ray's AWS provider imports it) or no
    credentials to sign with. Raises ConfigError."""
    if (cluster.get("provider") or {}).get("type") != "aws":
        return
    try:
        import boto3
    except ImportError:
        raise ConfigError(
            f"{_CLUSTER_KEY}.provider.type=aws needs boto3, which is not installed here: "
            'pip install "hydra-ray-launcher[aws]" (or boto3)'
        ) from None
    # botocore logs each lookup at INFO, which Hydra's logging shows.
    if logging.getLogger("botocore").level == logging.NOTSET:
        logging.getLogger("botocore").setLevel(logging.WARNING)
    if boto3.session.Session().get_credentials() is None:
        raise ConfigError(
            f"{_CLUSTER_KEY}.provider.type=aws: no AWS credentials found on this machine "
            "(~/.aws/credentials, AWS_PROFILE, AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, or an "
            "instance role). Run `aws configure` or set them, then run again: nothing was "
            "created"
        )


def named_cluster(
    cluster: Mapping[str, Any], settings: ClusterSettings, app_name: str
) -> dict[str, Any]:
    """`cluster` with its `cluster_name`: the user's (ray.cluster or cluster_yaml),
    used as it is, else one unique to this multirun, `hydra-<app>-<8 hex>`, so that
    two sweeps never share (and tear down) one cluster by accident. Call it once
    per multirun. Raises ConfigError for stop_cluster=false without a name: the
    next run could not find the kept cluster and would start (and pay for) a second."""
    name = cluster.get("cluster_name")
    if name:
        if not isinstance(name, str) or not _CLUSTER_NAME.fullmatch(name) or ".." in name:
            raise ConfigError(
                f"{_CLUSTER_KEY}.cluster_name={name!r} (or cluster_name in "
                "hydra.launcher.cluster_yaml) is not valid: the name goes into file names and "
                "commands on the head, so use letters, digits, '-', '_' and '.', starting with "
                "a letter or digit, at most 100 (e.g. 'my-sweep')"
            )
        return dict(cluster)
    if not settings.stop_cluster:
        raise ConfigError(
            "hydra.launcher.stop_cluster=false keeps the cluster for the next run, which "
            "finds it by its name, but no name is given: set "
            f"{_CLUSTER_KEY}.cluster_name (or cluster_name in hydra.launcher.cluster_yaml)"
        )
    app = re.sub(r"[^a-z0-9]+", "-", app_name.lower()).strip("-")[:20].strip("-") or "app"
    name = f"hydra-{app}-{secrets.token_hex(4)}"
    log.info(
        f"Cluster name {name!r}, unique to this multirun (set {_CLUSTER_KEY}.cluster_name "
        "to choose one)"
    )
    return {**cluster, "cluster_name": name}


def _load_cluster_yaml(path: str | None) -> dict[str, Any]:
    if path is None:
        return {}
    file = Path(path).expanduser().absolute()
    try:
        # OmegaConf's YAML loader; interpolations such as ${HOME} are kept as text.
        content = OmegaConf.to_container(OmegaConf.load(file), resolve=False)
    except Exception as exc:  # OSError, or the YAML parser's own error
        raise ConfigError(
            f"hydra.launcher.cluster_yaml={path}: cannot read {file} as a Ray cluster "
            f"YAML file ({exc}). Fix the path (relative to {Path.cwd()}, or absolute) "
            "or set it to null."
        ) from None
    if not isinstance(content, dict):
        raise ConfigError(
            f"hydra.launcher.cluster_yaml={path}: {file} does not hold a Ray cluster config "
            f"(a mapping of keys such as cluster_name, provider), but a list"
        )
    return {str(k): v for k, v in content.items()}


def _warn_legacy(where: str, key: str) -> None:
    log.warning(
        f"Ignoring {where}: current Ray's cluster config schema rejects `{key}` "
        "(a key of older Ray versions). Remove it from your config."
    )


def _merged(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` over `base`: dicts merged key by key, a null in `top` keeps `base`'s."""
    out = dict(base)
    for key, value in top.items():
        if value is None:
            continue
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


def _without_nulls_deep(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _without_nulls_deep(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls_deep(v) for v in value]
    return value


def _pip_commands(pip_packages: Mapping[str, Any]) -> list[str]:
    """`pip install NAME==VERSION` per package; null: the newest; a version that
    starts with a comparison (">=1.2") is used as a specifier as it is."""
    commands = []
    for name, version in pip_packages.items():
        # pip_packages keys are config keys: hydra_core means the distribution hydra-core.
        dist = name.replace("_", "-")
        if dist == "hydra-ray-launcher" and ".dev" in str(version):
            # An unreleased plugin is not on PyPI; every launch ships the plugin's
            # own source to the cluster anyway (see `launch.cluster`).
            continue
        if dist == "ray":
            # The nodes run Ray's dashboard and runtime-env agent: ray[default].
            dist = "ray[default]"
        if version is None:
            requirement = dist
        elif str(version)[:1] in "<>=!~":
            requirement = f"{dist}{version}"
        else:
            requirement = f"{dist}=={version}"
        commands.append(f"pip install {shlex.quote(requirement)}")
    return commands


def validate_cluster_config(cluster: Mapping[str, Any]) -> dict[str, Any]:
    """Check a cluster config (from `cluster_config_for_ray`) against Ray's own
    cluster schema, offline: what `ray up` would refuse is refused here, before
    anything is created. Returns the config with Ray's defaults filled in, as
    `ray up` sees it. Raises ConfigError naming the key and the fix."""
    provider = cluster.get("provider")
    if not isinstance(provider, Mapping) or not provider.get("type"):
        raise ConfigError(
            f"{_CLUSTER_KEY}.provider.type is not set: name the provider of the cluster's "
            f"nodes, e.g. `+{_CLUSTER_KEY}.provider.type=local "
            f"+{_CLUSTER_KEY}.provider.head_ip=HOST +{_CLUSTER_KEY}.provider.worker_ips=[...]`, "
            "or give a Ray cluster YAML file with hydra.launcher.cluster_yaml"
        )
    if provider["type"] == "local" and (
        cluster.get("available_node_types") or cluster.get("head_node_type")
    ):
        raise ConfigError(
            f"{_CLUSTER_KEY}.available_node_types and head_node_type cannot be set with "
            "provider local, whose nodes are provider.head_ip and provider.worker_ips: "
            "remove them (hydra/launcher=ray_cluster has neither by default)"
        )

    import click
    from ray.autoscaler._private.util import prepare_config, validate_config

    # jsonschema (a dependency of Ray's) has no type stubs in this project.
    schema_error: type[Exception] = importlib.import_module("jsonschema").ValidationError

    try:
        # prepare_config fills in the provider's defaults, as `ray up` does.
        prepared: dict[str, Any] = prepare_config(copy.deepcopy(dict(cluster)))
        validate_config(prepared)
    except schema_error as exc:
        raise ConfigError(_schema_error_message(exc)) from None
    except NotImplementedError as exc:
        raise ConfigError(
            f"{_CLUSTER_KEY}.provider.type={provider['type']}: {exc}. Use one of Ray's "
            "providers (aws, gcp, azure, local, ...) or `external` with a `module`."
        ) from None
    except AssertionError as exc:
        # Ray's own docker check: an image without a container name, or the reverse.
        raise ConfigError(
            f"{_CLUSTER_KEY}.docker: {exc}. Set both docker.image and "
            "docker.container_name, or docker.image='' for no docker."
        ) from None
    except (ValueError, KeyError, RuntimeError, click.ClickException) as exc:
        message = exc.format_message() if isinstance(exc, click.ClickException) else str(exc)
        raise ConfigError(
            f"Ray's cluster launcher refuses the cluster config ({_CLUSTER_KEY}): {message}"
        ) from None
    return prepared


def _schema_error_message(exc: Any) -> str:
    """A jsonschema.ValidationError as a message naming our config key."""
    path = [str(p) for p in exc.absolute_path]
    if exc.validator == "additionalProperties":
        found = re.search(r"\((.*) (?:was|were) unexpected\)", exc.message)
        names = re.findall(r"'([^']*)'", found.group(1)) if found else []
        # no_restart is in the schema but set by create_update_cluster, not by users.
        known = sorted(set(exc.schema.get("properties", {})) - {"no_restart"})
        keys = ", ".join(".".join([_CLUSTER_KEY, *path, n]) for n in names) or ".".join(
            [_CLUSTER_KEY, *path]
        )
        hint = f" The keys Ray knows there: {', '.join(known)}." if known else ""
        return (
            f"{keys}: Ray's cluster config schema has no such key. Remove it or fix its "
            f"name (a key of an older Ray, or a typo).{hint}"
        )
    if exc.validator == "required":
        found = re.search(r"'([^']*)' is a required property", exc.message)
        missing = [found.group(1)] if found else []
        key = ".".join([_CLUSTER_KEY, *path, *missing])
        return f"{key} is required by Ray's cluster config schema: set it."
    key = ".".join([_CLUSTER_KEY, *path])
    return f"{key}: Ray's cluster config schema refuses it: {exc.message}. Change it."


def check_launch_preconditions(settings: ClusterSettings, more: Sequence[ConfigError] = ()) -> None:
    """Refuse, before anything is created, a cluster launcher config that cannot
    work (every problem of `sweep_problems` and `cluster_launch_problems`, and
    the caller's `more`, in one error). Raises ConfigError."""
    refuse(sweep_problems(settings) + cluster_launch_problems(settings) + list(more))


# A path on the head: Ray's rsync and its docker runner hand it to a shell there
# unquoted, so only characters no shell reads as more than a name.
_REMOTE_PATH = re.compile(r"[A-Za-z0-9_./~+=:@,%-]+")


def remote_path_problems(settings: DetachedSettings, sweep_dir: str | None) -> list[ConfigError]:
    """Paths that name places on the cluster's head and would reach a shell
    there (a space, a quote, `$`, `;`, ...): refused by key, with the fix.
    `sweep_dir`: hydra.sweep.dir where the head uses it as it is (relative)."""
    head_paths = {
        "hydra.launcher.sync_up.target_dir": settings.sync_up.target_dir,
        "hydra.launcher.sync_down.source_dir": settings.sync_down.source_dir,
        "hydra.sweep.dir": sweep_dir,
    }
    return [
        ConfigError(
            f"{key}={value!r} goes to a shell on the cluster's head as it is (Ray's rsync "
            "and docker runner do not quote it): use only letters, digits and _ . / ~ + = "
            ": @ , % - in it"
        )
        for key, value in head_paths.items()
        if value is not None and not _REMOTE_PATH.fullmatch(str(value))
    ]


def cluster_launch_problems(settings: ClusterSettings) -> list[ConfigError]:
    """What makes a cluster launcher config unworkable before any cluster exists:
    contradicting options, a missing sync_up source, missing rsync/ssh, logging
    or run_env values out of range."""
    problems = []
    if settings.restart_only and settings.no_restart:
        problems.append(
            ConfigError(
                "hydra.launcher.create_update_cluster.restart_only=true and "
                "hydra.launcher.create_update_cluster.no_restart=true contradict each other "
                "(restart Ray only / never restart it): set at most one of them"
            )
        )
    problems += source_dir_problems(settings.sync_up.source_dir)
    problems += reconnect_problems(settings)
    problems += autodown_problems(settings)
    missing = [tool for tool in ("rsync", "ssh") if shutil.which(tool) is None]
    if missing:
        problems.append(
            ConfigError(
                f"{' and '.join(missing)} not found on PATH: the cluster launchers need rsync "
                "and ssh on this machine. Install them (e.g. `apt-get install rsync "
                "openssh-client`, or `brew install rsync`)."
            )
        )
    logging_values = {"log_style": settings.log_style, "color_mode": settings.color_mode}
    for key, choices in _LOGGING_CHOICES.items():
        if str(logging_values[key]).lower() not in choices:
            problems.append(
                ConfigError(
                    f"hydra.launcher.logging.{key}={logging_values[key]} is not one of "
                    f"{', '.join(choices)}"
                )
            )
    if not 0 <= settings.verbosity <= 3:
        problems.append(
            ConfigError(f"hydra.launcher.logging.verbosity={settings.verbosity} is not in 0..3")
        )
    if settings.run_env not in _RUN_ENVS:
        problems.append(
            ConfigError(
                f"hydra.launcher.ray.run_env={settings.run_env} is not one of "
                f"{', '.join(_RUN_ENVS)}"
            )
        )
    return problems


def _positive_seconds(value: Any) -> bool:
    """A finite number of seconds above 0 (not a bool, not null)."""
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _shown(value: Any) -> Any:
    """A number as a user would write it (120, not 120.0); anything else as it is."""
    return f"{value:g}" if isinstance(value, (int, float)) else value


def reconnect_problems(settings: DetachedSettings) -> list[ConfigError]:
    """`hydra.launcher.reconnect_s` (cluster launchers, ray_jobs) that cannot work."""
    reconnect = settings.reconnect_s
    if _positive_seconds(reconnect):
        return []
    return [
        ConfigError(
            f"hydra.launcher.reconnect_s={_shown(reconnect)} is not valid: set it to the "
            "seconds a lost connection to the cluster is made again while the sweep's driver "
            "runs there (default 120)"
        )
    ]


def autodown_problems(settings: ClusterSettings) -> list[ConfigError]:
    """`hydra.launcher.autodown_minutes` (cluster launchers) that cannot work."""
    minutes = settings.autodown_minutes
    if minutes is None or (_positive_seconds(minutes) and minutes <= _MAX_AUTODOWN_MINUTES):
        return []
    return [
        ConfigError(
            f"hydra.launcher.autodown_minutes={_shown(minutes)} is not valid: set it to the "
            "minutes the cluster may sit idle (no sweep driver, no transfer) before it tears "
            f"itself down (default 60, at most {_MAX_AUTODOWN_MINUTES}, a year), or null to "
            "keep it until `ray down`"
        )
    ]
