"""Every key of every launcher's config can be set from the command line, in
the forms docs/configuration.md shows (plain for a declared key, `+` for a key added below
a dict), and the value reaches what the launcher hands to Ray: ray.init(),
ray.remote() or the cluster config. The cases are generated from the config
dataclasses, so a key added later is covered too."""

import dataclasses
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.singleton import Singleton
from omegaconf import DictConfig, ListConfig, OmegaConf

from hydra_plugins.hydra_ray_launcher._config import (
    RayAWSLauncherConf,
    RayClusterLauncherConf,
    RayJobsLauncherConf,
    RayLauncherConf,
)
from hydra_ray.checks.resources import plain_dict, without_nulls
from hydra_ray.checks.validate import (
    _LEGACY_CLUSTER_KEYS,
    cluster_config_for_ray,
    ray_init_kwargs,
)
from hydra_ray.core.settings import ClusterSettings, Settings

APPS = Path(__file__).parent / "apps"
LAUNCHERS = {"ray": RayLauncherConf, "ray_aws": RayAWSLauncherConf}
LAUNCHERS["ray_cluster"] = RayClusterLauncherConf
LAUNCHERS["ray_jobs"] = RayJobsLauncherConf


def _leaves(node: type, prefix: str = "") -> Iterator[tuple[str, Any, Any]]:
    """(dotted key, type, default) of every leaf field."""
    hints = typing.get_type_hints(node)
    for f in dataclasses.fields(node):
        if f.name == "_target_":
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            yield from _leaves(type(default), f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", hints[f.name], default


def _sample(kind: Any, default: Any) -> tuple[str, str, Any]:
    """(override form, text, value): a value of the key's type, unlike its default."""
    if isinstance(default, dict):
        # A key added below a dict the config declares (typed str values stay str).
        values = typing.get_args(kind)[1:]
        typed_str = bool(values) and str in (typing.get_args(values[0]) or values)
        return "+", "7", "7" if typed_str else 7
    if typing.get_origin(kind) is list or isinstance(default, list):
        return "", "[a,b]", ["a", "b"]
    args = set(typing.get_args(kind)) - {type(None)}
    base = kind if not args else next(iter(args))
    if base is bool:
        return "", str(not default).lower(), not default
    if base is int:
        return "", "7", 7
    if base is float:
        return "", "2.5", 2.5
    if base is str:
        return "", "sample", "sample"
    # dicts and Any: a mapping, the value most such keys take.
    return "", "{sample_key: 7}", {"sample_key": 7}


CASES = [
    pytest.param(name, key, *_sample(kind, default), id=f"{name}:{key}")
    for name, conf in LAUNCHERS.items()
    for key, kind, default in _leaves(conf)
]


@pytest.fixture(autouse=True)
def _hydra_state_restored() -> Iterator[None]:
    """compose() in this process leaves Hydra's singletons set; the in-process
    conformance suites that run later must find them as they were."""
    before = dict(Singleton._instances)
    yield
    Singleton._instances.clear()
    Singleton._instances.update(before)


def _compose(launcher: str, override: str) -> DictConfig:
    with initialize_config_dir(version_base=None, config_dir=str(APPS)):
        cfg = compose(
            "app", overrides=[f"hydra/launcher={launcher}", override], return_hydra_config=True
        )
    settings = cfg.hydra.launcher
    assert isinstance(settings, DictConfig)
    return settings


@pytest.mark.parametrize(("launcher", "key", "plus", "text", "value"), CASES)
def test_every_key_is_settable_from_the_command_line_and_reaches_ray(
    launcher: str, key: str, plus: str, text: str, value: Any
) -> None:
    full = f"{key}.sample_key" if plus else key
    settings = _compose(launcher, f"{plus}hydra.launcher.{full}={text}")
    got = OmegaConf.select(settings, full)
    if isinstance(got, DictConfig | ListConfig):
        got = OmegaConf.to_container(got)
    assert got == value
    section, _, name = key.partition(".")
    if key.startswith("ray.init."):
        name = key.removeprefix("ray.init.")
        kwargs = ray_init_kwargs(plain_dict(settings.ray.init))
        assert kwargs["_memory" if name == "memory" else name] == value
    elif key.startswith("ray.remote."):
        assert without_nulls(plain_dict(settings.ray.remote))[key.removeprefix("ray.remote.")] == (
            value
        )
    elif key.startswith("ray.cluster.") and section == "ray":
        name = key.removeprefix("ray.cluster.")
        cluster_settings = Settings.of(settings)
        assert isinstance(cluster_settings, ClusterSettings)
        cluster = cluster_config_for_ray(cluster_settings)
        if name in _LEGACY_CLUSTER_KEYS:
            assert name not in cluster  # dropped with a warning: Ray refuses them
        elif name == "docker":
            assert name not in cluster  # a docker section without an image: no docker
        elif plus:
            assert cluster[name]["sample_key"] == 7
        elif name == "setup_commands":
            assert cluster[name][-2:] == value  # after env_setup's
        else:
            assert cluster[name] == value
