"""The cluster launchers' config (`ray_aws`, `ray_cluster`) as a user sees it with
`--cfg hydra`, and the checks and the cluster config built from it before a launch."""

import importlib.metadata
import logging
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_plugins.hydra_ray_launcher import __version__
from hydra_plugins.hydra_ray_launcher._config import (
    RayAWSLauncherConf,
    RayClusterLauncherConf,
    python_version,
)
from hydra_ray.checks.validate import (
    check_launch_preconditions,
    cluster_config_for_ray,
    named_cluster,
    remote_path_problems,
    validate_cluster_config,
)
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.settings import ClusterSettings, Settings

from .conftest import APPS

PY_MICRO = ".".join(map(str, sys.version_info[:3]))

# The long-sweep keys, as every launcher prints them.
LONG_SWEEP_DEFAULTS: dict[str, Any] = {
    "progress": True,
    "job_timeout_s": None,
    "max_concurrent_jobs": None,
    "stop_grace_s": 10.0,
    "retry_timed_out": False,
    "retries": 0,
    "resume": False,
    "dry_run": False,
}

# S10, as `--cfg hydra -p hydra.launcher` prints it for ray_aws (ray.init and
# ray.remote are checked apart: every key null).
RAY_AWS_DEFAULTS: dict[str, Any] = {
    "_target_": "hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher",
    "env_setup": {
        "pip_packages": {
            "omegaconf": "${ray_pkg_version:omegaconf}",
            "hydra_core": "${ray_pkg_version:hydra}",
            "ray": "${ray_pkg_version:ray}",
            "cloudpickle": "${ray_pkg_version:cloudpickle}",
            "hydra_ray_launcher": __version__,
        },
        "commands": [
            "conda create -n hydra_${python_version:micro} python=${python_version:micro} -y",
            "echo 'export PATH=\"$HOME/anaconda3/envs/hydra_${python_version:micro}/bin:$PATH\"'"
            " >> ~/.bashrc",
        ],
    },
    "cluster": {
        "cluster_name": None,
        "min_workers": 0,
        "upscaling_speed": 1.0,
        "max_workers": 1,
        "idle_timeout_minutes": 5,
        "docker": {"image": "", "container_name": "", "pull_before_run": True, "run_options": []},
        "provider": {
            "type": "aws",
            "region": "us-west-2",
            "availability_zone": "us-west-2a,us-west-2b",
            "cache_stopped_nodes": False,
            "key_pair": {"key_name": "hydra-${oc.env:USER,user}"},
        },
        "auth": {"ssh_user": "ubuntu"},
        "available_node_types": {
            "ray.head.default": {
                "resources": {},
                "node_config": {"InstanceType": "m5.large", "ImageId": "ami-0a2363a9cff180a64"},
            },
            "ray.worker.default": {
                "min_workers": 0,
                "max_workers": 2,
                "resources": {},
                "node_config": {
                    "InstanceType": "m5.large",
                    "ImageId": "ami-0a2363a9cff180a64",
                    "InstanceMarketOptions": {"MarketType": "spot"},
                },
            },
        },
        "head_node_type": "ray.head.default",
        "file_mounts": {},
        "initialization_commands": [],
        "cluster_synced_files": [],
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
        "head_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536;ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml",
        ],
        "worker_start_ray_commands": [
            "ray stop",
            "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
        ],
        "initial_workers": None,
        "autoscaling_mode": None,
        "target_utilization_fraction": None,
    },
    "run_env": "auto",
    "stop_cluster": True,
    "sync_up": {"source_dir": None, "target_dir": None, "include": [], "exclude": []},
    "sync_down": {
        "source_dir": None,
        "target_dir": None,
        "include": [],
        "exclude": [],
        # Beyond the guide: where the head stores the results for a gone launcher.
        "storage": None,
    },
    "logging": {"log_style": "auto", "color_mode": "auto", "verbosity": 0},
    "create_update_cluster": {"no_restart": False, "restart_only": False, "no_config_cache": False},
    "teardown_cluster": {"workers_only": False, "keep_min_workers": False},
    # A driver on the head that outlives the launcher's connection (beyond the guide).
    "reconnect_s": 120.0,
    "autodown_minutes": 60.0,
    # Long sweeps (beyond the guide): as for the `ray` launcher.
    **LONG_SWEEP_DEFAULTS,
}


def _run_app(
    *args: str, cwd: Path, env: dict[str, str] | None = None
) -> "subprocess.CompletedProcess[str]":
    """`python tests/apps/app.py ARGS` in `cwd`, as a user runs it."""
    return subprocess.run(
        [sys.executable, str(APPS / "app.py"), *args],
        cwd=cwd,
        env=env if env is not None else dict(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _printed_launcher(
    launcher: str,
    *overrides: str,
    cwd: Path,
    resolve: bool = False,
    env: dict[str, str] | None = None,
) -> DictConfig:
    """`python app.py hydra/launcher=LAUNCHER --cfg hydra -p hydra.launcher`, parsed."""
    res = _run_app(
        f"hydra/launcher={launcher}",
        *overrides,
        *("--cfg", "hydra", "-p", "hydra.launcher"),
        *(["--resolve"] if resolve else []),
        cwd=cwd,
        env={**os.environ, **(env or {})},
    )
    assert res.returncode == 0, res.stdout + res.stderr
    cfg = OmegaConf.create(res.stdout)
    assert isinstance(cfg, DictConfig)
    return cfg


def _structured(node: type) -> DictConfig:
    """A launcher config as Hydra composes it from the registered dataclass."""
    cfg = OmegaConf.structured(node)
    assert isinstance(cfg, DictConfig)
    return cfg


def _settings(cfg: DictConfig) -> ClusterSettings:
    """The settings a cluster launcher reads from its config (`core.settings`)."""
    settings = Settings.of(cfg)
    assert isinstance(settings, ClusterSettings)
    return settings


def _plain(cfg: DictConfig) -> dict[str, Any]:
    out = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(out, dict)
    return {str(k): v for k, v in out.items()}


def _aws(**cluster: Any) -> DictConfig:
    """A ray_aws launcher config as Hydra composes it, with ray.cluster keys set."""
    cfg = _structured(RayAWSLauncherConf)
    for key, value in cluster.items():
        cfg.ray.cluster[key] = value
    return cfg


def _local_cluster(tmp_path: Path) -> DictConfig:
    """A ray_cluster launcher config for two on-prem hosts."""
    cfg = _structured(RayClusterLauncherConf)
    cfg.ray.cluster.provider = {"type": "local", "head_ip": "10.0.0.2", "worker_ips": ["10.0.0.3"]}
    cfg.ray.cluster.auth = {"ssh_user": "me", "ssh_private_key": str(tmp_path / "key")}
    return cfg


# ---- the config a user prints ----


def test_ray_aws_prints_every_key_and_default_of_the_guide(tmp_path: Path) -> None:
    printed = _plain(_printed_launcher("ray_aws", cwd=tmp_path))
    ray = printed.pop("ray")
    assert ray.pop("init")["address"] is None
    assert set(ray.pop("remote").values()) == {None}
    assert {**printed, "cluster": ray.pop("cluster"), "run_env": ray.pop("run_env")} == (
        RAY_AWS_DEFAULTS
    )
    assert ray == {}


def test_ray_aws_resolves_versions_to_the_installed_packages(tmp_path: Path) -> None:
    printed = _printed_launcher("ray_aws", cwd=tmp_path, resolve=True, env={"USER": "alice"})
    assert dict(printed.env_setup.pip_packages) == {
        "omegaconf": importlib.metadata.version("omegaconf"),
        "hydra_core": importlib.metadata.version("hydra-core"),
        "ray": importlib.metadata.version("ray"),
        "cloudpickle": importlib.metadata.version("cloudpickle"),
        "hydra_ray_launcher": importlib.metadata.version("hydra-ray-launcher"),
    }
    assert list(printed.env_setup.commands) == [
        f"conda create -n hydra_{PY_MICRO} python={PY_MICRO} -y",
        f"echo 'export PATH=\"$HOME/anaconda3/envs/hydra_{PY_MICRO}/bin:$PATH\"' >> ~/.bashrc",
    ]
    assert printed.ray.cluster.provider.key_pair.key_name == "hydra-alice"


def test_the_key_pair_is_named_after_a_default_user_without_USER(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "USER"}
    res = _run_app(
        "hydra/launcher=ray_aws",
        *("--cfg", "hydra", "-p", "hydra.launcher.ray.cluster.provider.key_pair", "--resolve"),
        cwd=tmp_path,
        env=env,
    )
    assert res.returncode == 0, res.stderr
    assert OmegaConf.create(res.stdout).key_name == "hydra-user"


def test_ray_cluster_has_no_aws_defaults(tmp_path: Path) -> None:
    printed = _printed_launcher("ray_cluster", cwd=tmp_path)
    assert printed._target_ == RAY_AWS_DEFAULTS["_target_"]
    assert printed.cluster_yaml is None
    cluster = _plain(printed.ray.cluster)
    assert {k: v for k, v in cluster.items() if v not in (None, {})} == {}
    # null (not {}): a whole dict can then be set from the command line too.
    for key in ("provider", "auth", "docker", "available_node_types", "head_node_type"):
        assert cluster[key] is None, key
    # Everything around the cluster is as for ray_aws.
    for key in ("env_setup", "stop_cluster", "sync_up", "sync_down", "logging"):
        assert _plain(printed)[key] == RAY_AWS_DEFAULTS[key]


def test_the_guides_overrides_work_without_plus(tmp_path: Path) -> None:
    printed = _printed_launcher(
        "ray_aws",
        "hydra.launcher.stop_cluster=false",
        "hydra.launcher.ray.cluster.provider.cache_stopped_nodes=true",
        "hydra.launcher.teardown_cluster.workers_only=true",
        "hydra.launcher.teardown_cluster.keep_min_workers=true",
        "hydra.launcher.create_update_cluster.no_restart=true",
        "hydra.launcher.logging.log_style=record",
        "hydra.launcher.logging.color_mode=false",
        "hydra.launcher.logging.verbosity=3",
        "hydra.launcher.ray.run_env=host",
        cwd=tmp_path,
    )
    assert printed.stop_cluster is False
    assert printed.ray.cluster.provider.cache_stopped_nodes is True
    assert printed.teardown_cluster == {"workers_only": True, "keep_min_workers": True}
    assert printed.create_update_cluster.no_restart is True
    assert printed.logging.log_style == "record"
    assert str(printed.logging.color_mode).lower() == "false"
    assert printed.logging.verbosity == 3
    assert printed.ray.run_env == "host"


def test_a_local_provider_and_any_other_key_of_rays_schema_can_be_added(tmp_path: Path) -> None:
    printed = _printed_launcher(
        "ray_cluster",
        "+hydra.launcher.ray.cluster.provider.type=local",
        "+hydra.launcher.ray.cluster.provider.head_ip=10.0.0.2",
        "+hydra.launcher.ray.cluster.provider.worker_ips=[10.0.0.3,10.0.0.4]",
        "+hydra.launcher.ray.cluster.auth.ssh_user=me",
        "+hydra.launcher.ray.cluster.auth.ssh_private_key=/home/me/.ssh/id_ed25519",
        "+hydra.launcher.ray.cluster.rsync_exclude=[*.ckpt,.git]",
        "+hydra.launcher.ray.cluster.file_mounts_sync_continuously=true",
        "hydra.launcher.ray.cluster.max_workers=2",
        cwd=tmp_path,
    )
    cluster = cluster_config_for_ray(_settings(printed))
    assert cluster["provider"] == {
        "type": "local",
        "head_ip": "10.0.0.2",
        "worker_ips": ["10.0.0.3", "10.0.0.4"],
    }
    assert cluster["auth"] == {"ssh_user": "me", "ssh_private_key": "/home/me/.ssh/id_ed25519"}
    assert cluster["rsync_exclude"] == ["*.ckpt", ".git"]
    assert cluster["file_mounts_sync_continuously"] is True
    validate_cluster_config(cluster)
    # ray_aws takes the same keys; its provider type is set without `+`.
    aws = _printed_launcher(
        "ray_aws",
        "hydra.launcher.ray.cluster.provider.type=local",
        "+hydra.launcher.ray.cluster.provider.head_ip=10.0.0.2",
        "+hydra.launcher.ray.cluster.rsync_filter=[.gitignore]",
        cwd=tmp_path,
    )
    assert aws.ray.cluster.provider.head_ip == "10.0.0.2"
    assert list(aws.ray.cluster.rsync_filter) == [".gitignore"]


# ---- the resolvers ----


def test_python_version_levels() -> None:
    major, minor, micro = sys.version_info[:3]
    assert python_version("major") == f"{major}"
    assert python_version("minor") == python_version() == f"{major}.{minor}"
    assert python_version("micro") == f"{major}.{minor}.{micro}"
    with pytest.raises(ValueError, match="'nano' is not one of major, minor, micro"):
        python_version("nano")


def test_a_package_that_is_not_installed_is_named(tmp_path: Path) -> None:
    res = _run_app(
        "hydra/launcher=ray_aws",
        "+hydra.launcher.env_setup.pip_packages.torch=${ray_pkg_version:no_such_module_xyz}",
        *("--cfg", "hydra", "-p", "hydra.launcher.env_setup", "--resolve"),
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "no installed package provides 'no_such_module_xyz'" in res.stderr


# ---- the cluster config given to Ray ----


def test_the_default_aws_config_passes_rays_schema() -> None:
    cluster = cluster_config_for_ray(_settings(_aws()))
    validate_cluster_config(cluster)
    # No docker (image ''), no legacy keys: Ray would crash or refuse them.
    assert "docker" not in cluster
    assert not {"initial_workers", "autoscaling_mode", "target_utilization_fraction"} & set(cluster)
    assert cluster["provider"]["key_pair"]["key_name"].startswith("hydra-")


def test_pip_packages_and_commands_come_first_in_setup_commands_once() -> None:
    cfg = _aws(setup_commands=["echo mine"])
    cfg.env_setup.pip_packages.numpy = None
    cfg.env_setup.pip_packages.scipy = ">=1.11"
    first = cluster_config_for_ray(_settings(cfg))
    v = importlib.metadata.version
    assert first["setup_commands"] == [
        f"conda create -n hydra_{PY_MICRO} python={PY_MICRO} -y",
        f"echo 'export PATH=\"$HOME/anaconda3/envs/hydra_{PY_MICRO}/bin:$PATH\"' >> ~/.bashrc",
        f"pip install omegaconf=={v('omegaconf')}",
        f"pip install hydra-core=={v('hydra-core')}",
        f"pip install 'ray[default]=={v('ray')}'",
        f"pip install cloudpickle=={v('cloudpickle')}",
        # This plugin's own unreleased version is not on PyPI: it is shipped instead.
        "pip install numpy",
        "pip install 'scipy>=1.11'",
        "echo mine",
    ]
    # What the node's shell runs: one requirement per pip install, brackets intact.
    assert shlex.split(first["setup_commands"][4]) == [
        "pip",
        "install",
        f"ray[default]=={v('ray')}",
    ]
    # Once per multirun or twice: the same, and the user's config is untouched.
    assert cluster_config_for_ray(_settings(cfg)) == first
    assert list(cfg.ray.cluster.setup_commands) == ["echo mine"]
    assert ".dev" in __version__
    cfg.env_setup.pip_packages.hydra_ray_launcher = "2.0.0"
    assert (
        "pip install hydra-ray-launcher==2.0.0"
        in cluster_config_for_ray(_settings(cfg))["setup_commands"]
    )


def test_legacy_keys_are_dropped_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _aws(initial_workers=1, autoscaling_mode="default", target_utilization_fraction=0.8)
    with caplog.at_level(logging.WARNING):
        cluster = cluster_config_for_ray(_settings(cfg))
    for key in ("initial_workers", "autoscaling_mode", "target_utilization_fraction"):
        assert key not in cluster
        assert any(
            f"hydra.launcher.ray.cluster.{key}=" in r.message and "schema rejects" in r.message
            for r in caplog.records
        ), key
    validate_cluster_config(cluster)


def test_unset_legacy_keys_give_no_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cluster_config_for_ray(_settings(_aws()))
    assert caplog.records == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"max_workers": "many"}, "hydra.launcher.ray.cluster.max_workers:"),
        ({"rsync_excludes": ["*.pt"]}, "hydra.launcher.ray.cluster.rsync_excludes:"),
        ({"idle_timeout_minutes": -1}, "hydra.launcher.ray.cluster.idle_timeout_minutes:"),
        ({"auth": {"ssh_user": "u", "ssh_key": "k"}}, "hydra.launcher.ray.cluster.auth.ssh_key:"),
    ],
)
def test_a_schema_error_names_the_key(change: dict[str, Any], named: str) -> None:
    cluster = {**cluster_config_for_ray(_settings(_aws())), **change}
    with pytest.raises(ConfigError) as err:
        validate_cluster_config(cluster)
    assert str(err.value).startswith(named)


def test_an_unknown_key_is_shown_beside_the_keys_ray_knows() -> None:
    cluster = {**cluster_config_for_ray(_settings(_aws())), "rsync_excludes": ["*.pt"]}
    with pytest.raises(ConfigError, match="Ray's cluster config schema has no such key") as err:
        validate_cluster_config(cluster)
    assert "rsync_exclude," in str(err.value)


def test_a_typo_inside_a_node_type_is_named_with_its_path() -> None:
    cfg = _aws()
    cfg.ray.cluster.available_node_types["ray.worker.default"].min_worker = 1
    with pytest.raises(ConfigError) as err:
        validate_cluster_config(cluster_config_for_ray(_settings(cfg)))
    assert "hydra.launcher.ray.cluster.available_node_types.ray.worker.default.min_worker" in str(
        err.value
    )


def test_a_head_node_type_that_is_not_a_node_type_is_refused() -> None:
    with pytest.raises(ConfigError, match="`head_node_type` must be one of"):
        validate_cluster_config(
            cluster_config_for_ray(_settings(_aws(head_node_type="ray.head.gpu")))
        )


def test_a_docker_image_needs_a_container_name() -> None:
    cfg = _aws(docker={"image": "rayproject/ray:2.60.0", "container_name": ""})
    with pytest.raises(ConfigError, match=r"hydra.launcher.ray.cluster.docker: .*container_name"):
        validate_cluster_config(cluster_config_for_ray(_settings(cfg)))
    cfg.ray.cluster.docker.container_name = "ray"
    cluster = cluster_config_for_ray(_settings(cfg))
    assert cluster["docker"]["image"] == "rayproject/ray:2.60.0"
    validate_cluster_config(cluster)


def test_ray_cluster_without_a_provider_says_what_to_set(tmp_path: Path) -> None:
    cluster = cluster_config_for_ray(_settings(_structured(RayClusterLauncherConf)))
    with pytest.raises(ConfigError, match=r"hydra.launcher.ray.cluster.provider.type is not set"):
        validate_cluster_config(cluster)
    cluster["provider"] = {"type": "gpc"}
    with pytest.raises(ConfigError, match=r"provider.type=gpc: Unsupported node provider"):
        validate_cluster_config(cluster)


def test_ray_cluster_with_only_a_provider_gets_rays_defaults_for_it() -> None:
    cfg = _structured(RayClusterLauncherConf)
    cfg.ray.cluster.provider = {"type": "aws", "region": "eu-west-1"}
    cluster = cluster_config_for_ray(_settings(cfg))
    assert set(cluster) == {"provider", "setup_commands"}
    validate_cluster_config(cluster)


def test_a_local_cluster_passes_with_rays_own_defaults(tmp_path: Path) -> None:
    cluster = cluster_config_for_ray(_settings(_local_cluster(tmp_path)))
    # Nothing of ray_cluster's own but the provider, auth and the environment setup.
    assert set(cluster) == {"provider", "auth", "setup_commands"}
    validate_cluster_config(cluster)
    cluster["available_node_types"] = {"x": {"resources": {}, "node_config": {}}}
    with pytest.raises(ConfigError, match="available_node_types and head_node_type cannot be set"):
        validate_cluster_config(cluster)


def test_cluster_yaml_is_the_base_and_ray_cluster_keys_go_on_top(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("cluster.yaml").write_text(
        "cluster_name: from-yaml\n"
        "max_workers: 3\n"
        "target_utilization_fraction: 0.8\n"
        "provider: {type: local, head_ip: 10.0.0.9, worker_ips: [10.0.0.10, 10.0.0.11]}\n"
        "auth: {ssh_user: yaml-user}\n"
        "setup_commands: ['echo from yaml ${HOME}']\n"
        "head_start_ray_commands: [ray stop, 'ray start --head --port=6379']\n"
    )
    cfg = _structured(RayClusterLauncherConf)
    cfg.cluster_yaml = "cluster.yaml"
    cfg.ray.cluster.max_workers = 1
    cfg.ray.cluster.provider = {"worker_ips": ["10.0.0.10"]}
    cfg.ray.cluster.auth = {"ssh_private_key": "~/.ssh/k"}
    with caplog.at_level(logging.WARNING):
        cluster = cluster_config_for_ray(_settings(cfg))
    assert cluster["cluster_name"] == "from-yaml"
    assert cluster["max_workers"] == 1
    assert cluster["provider"] == {
        "type": "local",
        "head_ip": "10.0.0.9",
        "worker_ips": ["10.0.0.10"],
    }
    assert cluster["auth"] == {"ssh_user": "yaml-user", "ssh_private_key": "~/.ssh/k"}
    assert cluster["head_start_ray_commands"] == ["ray stop", "ray start --head --port=6379"]
    # env_setup first, then the file's own setup commands, shell variables intact.
    assert cluster["setup_commands"][0].startswith("conda create")
    assert cluster["setup_commands"][-1] == "echo from yaml ${HOME}"
    assert "target_utilization_fraction" not in cluster
    assert any(
        "target_utilization_fraction in hydra.launcher.cluster_yaml" in r.message
        for r in caplog.records
    )
    validate_cluster_config(cluster)


def test_a_cluster_yaml_that_cannot_be_read_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _structured(RayClusterLauncherConf)
    cfg.cluster_yaml = "missing.yaml"
    with pytest.raises(ConfigError, match=r"hydra.launcher.cluster_yaml=missing.yaml: cannot read"):
        cluster_config_for_ray(_settings(cfg))
    Path("list.yaml").write_text("- a\n- b\n")
    cfg.cluster_yaml = "list.yaml"
    with pytest.raises(
        ConfigError, match=r"hydra.launcher.cluster_yaml=list.yaml: .* does not hold"
    ):
        cluster_config_for_ray(_settings(cfg))


# ---- checks before anything is created ----


def test_restart_only_and_no_restart_together_are_refused() -> None:
    cfg = _aws()
    cfg.create_update_cluster.restart_only = True
    check_launch_preconditions(_settings(cfg))
    cfg.create_update_cluster.no_restart = True
    with pytest.raises(ConfigError) as err:
        check_launch_preconditions(_settings(cfg))
    assert "hydra.launcher.create_update_cluster.restart_only=true" in str(err.value)
    assert "hydra.launcher.create_update_cluster.no_restart=true" in str(err.value)


def test_a_missing_sync_up_source_dir_is_refused_with_its_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _aws()
    cfg.sync_up.source_dir = "code"
    with pytest.raises(ConfigError) as err:
        check_launch_preconditions(_settings(cfg))
    assert f"hydra.launcher.sync_up.source_dir=code: {tmp_path / 'code'} is not a directory" in str(
        err.value
    )
    (tmp_path / "code").mkdir()
    check_launch_preconditions(_settings(cfg))
    cfg.sync_up.source_dir = str(tmp_path / "code")
    check_launch_preconditions(_settings(cfg))


def test_missing_rsync_and_ssh_are_refused_with_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(
        ConfigError, match=r"rsync and ssh not found on PATH.*apt-get install rsync"
    ):
        check_launch_preconditions(_settings(_aws()))


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("logging.log_style", "fancy"),
        ("logging.color_mode", "sometimes"),
        ("logging.verbosity", 4),
        ("logging.verbosity", -1),
        ("ray.run_env", "vm"),
        ("reconnect_s", 0),
        ("reconnect_s", -5),
        ("autodown_minutes", 0),
        ("autodown_minutes", -1),
    ],
)
def test_values_out_of_range_are_refused(key: str, value: Any) -> None:
    cfg = _aws()
    OmegaConf.update(cfg, key, value)
    with pytest.raises(ConfigError, match=f"hydra.launcher.{key}={value} is not"):
        check_launch_preconditions(_settings(cfg))


def test_autodown_can_be_turned_off() -> None:
    cfg = _aws()
    OmegaConf.update(cfg, "autodown_minutes", None)
    check_launch_preconditions(_settings(cfg))


def test_every_problem_of_a_launch_is_refused_at_once(tmp_path: Path) -> None:
    cfg = _aws()
    OmegaConf.update(cfg, "logging.verbosity", 7)
    OmegaConf.update(cfg, "ray.run_env", "vm")
    OmegaConf.update(cfg, "sync_up.source_dir", str(tmp_path / "missing"))
    with open_dict(cfg.ray.remote):  # as `+hydra.launcher.ray.remote.num_gpu=1` adds it
        cfg.ray.remote.num_gpu = 1
    with pytest.raises(ConfigError) as refused:
        check_launch_preconditions(_settings(cfg))
    message = str(refused.value)
    for key in ("logging.verbosity=7", "ray.run_env=vm", "sync_up.source_dir=", "ray.remote is"):
        assert f"hydra.launcher.{key}" in message, message


def test_the_guides_logging_values_pass() -> None:
    cfg = _aws()
    for style in ("auto", "pretty", "record"):
        for color in ("auto", "true", "false", True, False):
            for verbosity in range(4):
                cfg.logging.log_style = style
                cfg.logging.color_mode = color
                cfg.logging.verbosity = verbosity
                check_launch_preconditions(_settings(cfg))


def test_ray_prints_the_long_sweep_keys_with_their_defaults(tmp_path: Path) -> None:
    printed = _printed_launcher("ray", cwd=tmp_path)
    assert {k: printed[k] for k in LONG_SWEEP_DEFAULTS} == LONG_SWEEP_DEFAULTS


def test_the_plugin_ships_with_the_rich_that_draws_the_heads_display(tmp_path: Path) -> None:
    """The cluster's pip packages need not include rich: it travels with the plugin."""
    from hydra_ray.launch import cluster as _remote

    sent: list[tuple[str, str]] = []

    class FakeCluster:
        def rsync_up(self, source: str, target: str) -> None:
            sent.append((source, target))

    _remote._ship_plugin(FakeCluster(), "/tmp/hydra-ray-x", tmp_path)  # type: ignore[arg-type]
    assert sent == [(f"{tmp_path / 'plugin'}/", "/tmp/hydra-ray-x/plugin/")]
    staged = tmp_path / "plugin"
    assert (staged / "hydra_plugins" / "hydra_ray_launcher" / "ray_aws_launcher.py").is_file()
    assert (staged / "hydra_ray" / "driver" / "head.py").is_file()
    assert (staged / "rich" / "live.py").is_file()
    assert not list(staged.rglob("__pycache__"))


def test_without_a_cluster_name_each_multirun_gets_its_own_named_after_the_app() -> None:
    cluster = cluster_config_for_ray(_settings(_aws()))
    assert "cluster_name" not in cluster
    first = named_cluster(cluster, _settings(_aws()), "My_App")
    second = named_cluster(cluster, _settings(_aws()), "My_App")
    assert re.fullmatch(r"hydra-my-app-[0-9a-f]{8}", first["cluster_name"])
    assert first["cluster_name"] != second["cluster_name"]
    validate_cluster_config(first)


def test_a_cluster_name_given_by_the_user_is_used_as_it_is(tmp_path: Path) -> None:
    given = _aws(cluster_name="shared-cluster")
    assert named_cluster(cluster_config_for_ray(_settings(given)), _settings(given), "app")[
        "cluster_name"
    ] == ("shared-cluster")
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text("cluster_name: from-yaml\nprovider: {type: local, head_ip: h}\n")
    cfg = _structured(RayClusterLauncherConf)
    cfg.cluster_yaml = str(cluster_yaml)
    assert (
        named_cluster(cluster_config_for_ray(_settings(cfg)), _settings(cfg), "app")["cluster_name"]
        == "from-yaml"
    )


def test_stop_cluster_false_without_a_cluster_name_is_refused_before_anything_starts() -> None:
    cfg = _aws()
    cfg.stop_cluster = False
    with pytest.raises(ConfigError, match=r"set hydra\.launcher\.ray\.cluster\.cluster_name"):
        named_cluster(cluster_config_for_ray(_settings(cfg)), _settings(cfg), "app")


@pytest.mark.parametrize("name", ["../../.ssh", "a b", "-rf", "x;reboot", "a..b"])
def test_a_cluster_name_that_is_no_plain_name_is_refused_with_the_characters_to_use(
    name: str,
) -> None:
    """The name goes into paths and commands on the head (the autodown watchdog's
    disarm once became `rm -rf ~/.hydra_ray/autodown/../../.ssh`)."""
    cfg = _aws(cluster_name=name)
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.ray\.cluster\.cluster_name=") as exc:
        named_cluster(cluster_config_for_ray(_settings(cfg)), _settings(cfg), "app")
    assert "letters, digits, '-', '_' and '.'" in str(exc.value)
    ok = _aws(cluster_name="my-sweep_2.b")
    assert (
        named_cluster(cluster_config_for_ray(_settings(ok)), _settings(ok), "app")["cluster_name"]
        == "my-sweep_2.b"
    )


@pytest.mark.parametrize("minutes", [1e17, 525_601])
def test_an_autodown_longer_than_a_year_is_refused_naming_null_instead(minutes: float) -> None:
    cfg = _aws()
    OmegaConf.update(cfg, "autodown_minutes", minutes)
    with pytest.raises(ConfigError, match=r"autodown_minutes=.* is not valid.*at most 525600") as e:
        check_launch_preconditions(_settings(cfg))
    assert "or null to keep it until `ray down`" in str(e.value)
    OmegaConf.update(cfg, "autodown_minutes", 525_600)
    check_launch_preconditions(_settings(cfg))


def _without_aws(tmp_path: Path) -> dict[str, str]:
    """A user's environment with no AWS credentials anywhere."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # No instance role to ask for either (this is no EC2 instance).
    return {**env, "HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"}


def test_ray_aws_without_credentials_is_one_clear_error_before_anything(tmp_path: Path) -> None:
    res = _run_app(
        "--multirun", "x=1,2", "hydra/launcher=ray_aws", cwd=tmp_path, env=_without_aws(tmp_path)
    )
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "hydra.launcher.ray.cluster.provider.type=aws: no AWS credentials found" in out
    # Nothing was created: no teardown line, no jobs listed as interrupted, no traceback.
    assert "Tearing down" not in out and "Creating or updating" not in out
    assert "interrupted" not in out and "Traceback" not in out


def test_ray_aws_without_boto3_says_how_to_install_it(tmp_path: Path) -> None:
    # A stand-in for a machine without boto3: an import of it fails as it would.
    blocker = tmp_path / "no_boto3" / "boto3"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text("raise ImportError(\"No module named 'boto3'\")\n")
    env = {**_without_aws(tmp_path), "PYTHONPATH": str(blocker.parent)}
    res = _run_app("--multirun", "x=1", "hydra/launcher=ray_aws", cwd=tmp_path, env=env)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert 'pip install "hydra-ray-launcher[aws]"' in out
    assert "Tearing down" not in out and "interrupted" not in out


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("hydra.launcher.sync_up.target_dir", "code; touch /tmp/pwned"),
        ("hydra.launcher.sync_down.source_dir", "out dir"),
        ("hydra.sweep.dir", "multirun/$(id)"),
    ],
)
def test_a_path_on_the_head_that_a_shell_there_would_read_is_refused(key: str, value: str) -> None:
    """Ray's rsync and docker runner hand these paths to a shell on the head
    unquoted: a space, `;` or `$(...)` is refused by its key before anything."""
    cfg = _aws()
    sweep_dir = "multirun/2026-12-07/13-20-00"
    if key == "hydra.sweep.dir":
        sweep_dir = value
    else:
        OmegaConf.update(cfg, key.removeprefix("hydra.launcher."), value)
    with pytest.raises(ConfigError) as err:
        check_launch_preconditions(_settings(cfg), remote_path_problems(_settings(cfg), sweep_dir))
    assert f"{key}={value!r} goes to a shell on the cluster's head" in str(err.value)
    # Hydra's default names, and the ones the launcher gives, pass.
    check_launch_preconditions(
        _settings(_aws()), remote_path_problems(_settings(_aws()), "multirun/2026-12-07/13-20-00")
    )
    check_launch_preconditions(_settings(_aws()), remote_path_problems(_settings(_aws()), None))
