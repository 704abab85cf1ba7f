"""Jobs on machines without the app's config files compose their configs from
the snapshot of its sources the sweep state carries: the same configs, and
the same errors, as composing from the files. (End to end: the fake-hosts
cluster tests, whose nodes do not see the launching machine's /tmp, where
their apps are.)"""

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import hydra
import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import HydraException
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf

from hydra_ray.core.jobs import Job
from hydra_ray.engine.snapshot import portable_context, why_not_portable
from hydra_ray.engine.worker import composed_here

FILES = {
    "config.yaml": "defaults:\n  - db: mysql\n  - model/encoder: small\n  - _self_\n"
    "lr: 0.1\nname: run-${db.driver}-${lr}\n",
    "db/mysql.yaml": "driver: mysql\nport: 3306\n",
    "db/postgres.yaml": "driver: postgres\nport: 5432\n",
    "model/encoder/small.yaml": "width: 8\n",
    "model/encoder/big.yaml": "defaults:\n  - small\n  - _self_\nwidth: 1024\n",
    # A config that moves its keys to the root.
    "extras/everywhere.yaml": "# @package _global_\nextra_flag: true\n",
    # A draft nobody uses: reading it fails, which must not fail the others.
    "db/broken.yaml": "driver: [unclosed\n",
    "db/__init__.py": "",
}

SWEEP = [
    [],
    ["db=postgres", "lr=0.5"],
    ["model/encoder=big"],
    ["+extras=everywhere", "db.port=1"],
    ["hydra.job.name=other", "hydra/job_logging=disabled"],
]


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    for name, text in FILES.items():
        (conf / name).parent.mkdir(parents=True, exist_ok=True)
        (conf / name).write_text(text)
    return conf


@pytest.fixture
def hydra_context(conf_dir: Path) -> Iterator[HydraContext]:
    # Hydra 1.4 deprecates version_base; 1.3 warns when it is not given.
    base: dict[str, Any] = {"version_base": None} if hydra.__version__.startswith("1.3") else {}
    with initialize_config_dir(config_dir=str(conf_dir), **base):
        loader = GlobalHydra.instance().config_loader()
        yield HydraContext(config_loader=loader, callbacks=None)  # type: ignore[arg-type]


def _master(context: HydraContext) -> DictConfig:
    return context.config_loader.load_configuration(
        "config", overrides=[], run_mode=RunMode.MULTIRUN
    )


def _yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg)


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_every_job_config_composed_from_the_snapshot_equals_the_one_from_the_files(
    hydra_context: HydraContext, conf_dir: Path
) -> None:
    master = _master(hydra_context)
    from_files = [_yaml(hydra_context.config_loader.load_sweep_config(master, o)) for o in SWEEP]
    # As it travels to the cluster, and then the files are gone.
    shipped = cloudpickle.loads(cloudpickle.dumps(portable_context(hydra_context)))
    shutil.rmtree(conf_dir)

    from_snapshot = [_yaml(shipped.config_loader.load_sweep_config(master, o)) for o in SWEEP]

    assert from_snapshot == from_files
    composed = shipped.config_loader.load_sweep_config(master, ["db=postgres", "lr=0.5"])
    assert (composed.db.driver, composed.name) == ("postgres", "run-postgres-0.5")
    assert OmegaConf.select(composed, "hydra.runtime.config_sources")[1].path == str(conf_dir)
    # The files of this machine are not read again: they are gone.
    with pytest.raises(HydraException):
        hydra_context.config_loader.load_sweep_config(master, [])


@pytest.mark.usefixtures("hydra_restore_singletons")
@pytest.mark.parametrize(
    "overrides",
    [["db=oracle"], ["db=broken"], ["+extras=missing"], ["model/encoder=huge"]],
    ids=["unknown-option", "unreadable-config", "unknown-option-added", "unknown-nested-option"],
)
def test_a_job_whose_config_cannot_be_composed_fails_with_the_words_the_files_give(
    hydra_context: HydraContext, overrides: list[str]
) -> None:
    master = _master(hydra_context)
    with pytest.raises(Exception) as from_files:
        hydra_context.config_loader.load_sweep_config(master, overrides)
    shipped = cloudpickle.loads(cloudpickle.dumps(portable_context(hydra_context)))

    with pytest.raises(Exception) as from_snapshot:
        shipped.config_loader.load_sweep_config(master, overrides)

    assert type(from_snapshot.value) is type(from_files.value)
    words = str(from_files.value).splitlines()[0]
    assert str(from_snapshot.value).splitlines()[0] == words


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_the_launching_process_keeps_composing_from_its_files(
    hydra_context: HydraContext, conf_dir: Path
) -> None:
    master = _master(hydra_context)
    portable_context(hydra_context)
    (conf_dir / "db" / "mysql.yaml").write_text("driver: mysql\nport: 7\n")

    assert hydra_context.config_loader.load_sweep_config(master, []).db.port == 7


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_what_a_snapshot_cannot_stand_in_for_is_named(hydra_context: HydraContext) -> None:
    master = _master(hydra_context)
    assert why_not_portable(master, SWEEP) is None
    assert why_not_portable(master, [["hydra.searchpath=[file:///x]"]]) == (
        "a job overrides hydra.searchpath"
    )
    searched = hydra_context.config_loader.load_configuration(
        "config", overrides=["hydra.searchpath=[pkg://hydra.conf]"], run_mode=RunMode.MULTIRUN
    )
    assert why_not_portable(searched, []) == "hydra.searchpath is set"
    copied = hydra_context.config_loader.load_configuration(
        "config", overrides=["hydra.job.env_copy=[HOME]"], run_mode=RunMode.MULTIRUN
    )
    assert why_not_portable(copied, []) == "hydra.job.env_copy is set"


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_where_a_snapshot_cannot_stand_in_every_config_is_composed_here(
    hydra_context: HydraContext,
) -> None:
    master = _master(hydra_context)
    jobs = [Job(0, ["db=postgres"]), Job(1, ["lr=0.5"])]
    assert composed_here(hydra_context, master, jobs) is None
    searched = hydra_context.config_loader.load_configuration(
        "config", overrides=["hydra.searchpath=[pkg://hydra.conf]"], run_mode=RunMode.MULTIRUN
    )

    configs = composed_here(hydra_context, searched, jobs)

    assert configs is not None
    assert (configs[0].db.driver, configs[1].lr) == ("postgres", 0.5)


# Yaml files a config dir (config_path=".") gathers that are not the app's configs.
NOT_CONFIGS = [
    "multirun/2026-12-04/10-00-00/multirun.yaml",
    "multirun/2026-12-04/10-00-00/0/.hydra/config.yaml",
    "multirun/2026-12-04/10-00-00/0/results.yaml",
    "outputs/2026-12-04/09-00-00/.hydra/hydra.yaml",
    ".venv/lib/python3.11/site-packages/somepkg/defaults.yaml",
    "venv/lib/python3.11/site-packages/somepkg/defaults.yaml",
    ".git/info/x.yaml",
    "node_modules/y.yaml",
]


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_past_outputs_and_environments_in_the_config_dir_are_not_shipped_with_the_state(
    hydra_context: HydraContext, conf_dir: Path
) -> None:
    for name in NOT_CONFIGS:
        (conf_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (conf_dir / name).write_text(f"note: NOT_A_CONFIG {'x' * 10_000}\n")
    master = _master(hydra_context)
    from_files = [_yaml(hydra_context.config_loader.load_sweep_config(master, o)) for o in SWEEP]

    portable = portable_context(hydra_context)
    here = portable.config_loader.load_sweep_config(master, ["+node_modules=y"])
    blob = cloudpickle.dumps(portable)
    shutil.rmtree(conf_dir)
    shipped = cloudpickle.loads(blob)

    assert b"NOT_A_CONFIG" not in blob
    assert [_yaml(shipped.config_loader.load_sweep_config(master, o)) for o in SWEEP] == from_files
    # On this machine a job that names one of those dirs finds it in the files;
    # elsewhere, as without the files, there is no such group: a plain value.
    assert here.node_modules.note.startswith("NOT_A_CONFIG")
    elsewhere = shipped.config_loader.load_sweep_config(master, ["+node_modules=y"])
    assert elsewhere.node_modules == "y"
    assert shipped.config_loader.get_sources()[1].list("node_modules", None) == []
