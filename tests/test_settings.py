"""`hydra.launcher` read once into typed settings (`hydra_ray.core.settings`):
each launcher's config gives its own kind, with the face's defaults and the
user's values as given, and a value that cannot be read is refused by key,
before anything starts."""

import pytest
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hydra_ray_launcher._config import (
    RayAWSLauncherConf,
    RayClusterLauncherConf,
    RayJobsLauncherConf,
    RayLauncherConf,
)
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.jobs import Policy
from hydra_ray.core.settings import (
    ClusterSettings,
    DetachedSettings,
    JobsSettings,
    Settings,
    SyncDown,
    SyncUp,
)


def _config(node: type) -> DictConfig:
    cfg = OmegaConf.structured(node)
    assert isinstance(cfg, DictConfig)
    return cfg


@pytest.mark.parametrize(
    ("node", "kind"),
    [
        (RayLauncherConf, Settings),
        (RayAWSLauncherConf, ClusterSettings),
        (RayClusterLauncherConf, ClusterSettings),
        (RayJobsLauncherConf, JobsSettings),
    ],
    ids=["ray", "ray_aws", "ray_cluster", "ray_jobs"],
)
def test_each_launcher_s_config_gives_its_own_kind_of_settings_with_the_face_s_defaults(
    node: type, kind: type
) -> None:
    settings = Settings.of(_config(node))
    assert type(settings) is kind
    assert settings.policy == Policy()  # the engine's defaults are the face's
    assert settings.progress is True and settings.resume is False and settings.dry_run is False
    assert settings.ray_init["address"] is None  # null: Ray's own default, passed on as null
    if isinstance(settings, DetachedSettings):
        assert settings.reconnect_s == 120.0
        assert settings.sync_down == SyncDown(None, [], [], None)


def test_the_cluster_keys_are_read_from_their_sections() -> None:
    cfg = _config(RayAWSLauncherConf)
    cfg.logging.verbosity = 2
    cfg.create_update_cluster.no_config_cache = True
    cfg.teardown_cluster.keep_min_workers = True
    cfg.env_setup.commands = ["echo one"]
    cfg.ray.run_env = "host"
    cfg.sync_up.source_dir = "src"
    cfg.sync_up.exclude = ["*.ckpt"]
    settings = Settings.of(cfg)
    assert isinstance(settings, ClusterSettings)
    assert (settings.verbosity, settings.no_config_cache, settings.keep_min_workers) == (
        2,
        True,
        True,
    )
    assert settings.setup_commands == ["echo one"]
    assert settings.run_env == "host"
    assert settings.sync_up == SyncUp("src", None, [], ["*.ckpt"])
    assert settings.cluster["provider"]["type"] == "aws"
    assert settings.stop_cluster is True and settings.autodown_minutes == 60.0


def test_the_dashboard_keys_are_plain_data_interpolations_resolved(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HYDRA_RAY_TEST_TOKEN", "s3cret")
    cfg = _config(RayJobsLauncherConf)
    cfg.address = "http://127.0.0.1:8265"
    cfg.headers = {"Authorization": "Bearer ${oc.env:HYDRA_RAY_TEST_TOKEN}"}
    cfg.runtime_env = {"env_vars": {"A": "1"}}
    settings = Settings.of(cfg)
    assert isinstance(settings, JobsSettings)
    assert settings.headers == {"Authorization": "Bearer s3cret"}
    assert settings.runtime_env == {"env_vars": {"A": "1"}}
    assert not OmegaConf.is_config(settings.headers)


def test_ray_remote_stays_the_config_node_for_each_job_to_resolve() -> None:
    cfg = _config(RayLauncherConf)
    cfg.ray.remote.num_gpus = "${model.gpus}"  # the job's own config has `model`
    settings = Settings.of(cfg)  # not resolved here: no error
    assert OmegaConf.is_config(settings.ray_remote)
    assert OmegaConf.to_container(settings.ray_remote)["num_gpus"] == "${model.gpus}"  # type: ignore[index, call-overload]


def test_the_settings_cannot_be_changed_by_a_module_below() -> None:
    settings = Settings.of(_config(RayLauncherConf))
    with pytest.raises(AttributeError):
        settings.retries = 3  # type: ignore[misc]


def test_a_value_that_cannot_be_read_is_refused_naming_its_key() -> None:
    """(Hydra resolves the launcher's node when it makes the launcher; a value
    read later, e.g. from an environment variable, is named as well.)"""
    cfg = _config(RayJobsLauncherConf)
    cfg.sync_down.storage = "${oc.env:HYDRA_RAY_TEST_NO_SUCH_VARIABLE}"
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.sync_down\.storage cannot be read"):
        Settings.of(cfg)


def test_the_settings_repr_shows_no_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token, a URI's credentials, an env var's value: resolved into the
    settings, but never in their repr (a log line, an assertion message)."""
    monkeypatch.setenv("HYDRA_RAY_TEST_TOKEN", "s3cret-token")
    cfg = _config(RayJobsLauncherConf)
    cfg.headers = {"Authorization": "Bearer ${oc.env:HYDRA_RAY_TEST_TOKEN}"}
    cfg.runtime_env = {"env_vars": {"WANDB_API_KEY": "s3cret-env"}}
    cfg.ray.init.runtime_env = {"env_vars": {"HF_TOKEN": "s3cret-init"}}
    cfg.sync_down.storage = "s3://bucket/p?secret_key=s3cret-uri"
    settings = Settings.of(cfg)
    assert isinstance(settings, JobsSettings)
    assert settings.headers == {"Authorization": "Bearer s3cret-token"}  # there to use
    shown = repr(settings)
    assert "s3cret" not in shown, shown
    assert "entrypoint_python=None" in shown  # the rest is shown
    cluster = _config(RayAWSLauncherConf)
    cluster.ray.cluster.provider["aws_secret_access_key"] = "s3cret-aws"
    assert "s3cret" not in repr(Settings.of(cluster))
