"""The engine in-process, on the session's Ray: what it ships and how often."""

import os
from pathlib import Path
from typing import Any

import pytest
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import DictConfig

from hydra_plugins.hydra_ray_launcher._validate import ray_init_kwargs


class UnpickleProbe:
    """Appends the pid of every process that unpickles it to a file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_shared_state_is_unpickled_once_per_worker_not_per_job(
    ray_session: str, hydra_sweep_runner: TSweepRunner, tmp_path: Path
) -> None:
    probe = UnpickleProbe(tmp_path / "unpickled_by")

    def task(cfg: DictConfig) -> int:
        assert probe.path  # the task function, and so the probe, is shared state
        return os.getpid()

    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=task,
        config_path="configs",
        config_name="compose.yaml",
        overrides=["hydra/launcher=ray", "+a=0,1,2,3,4,5,6,7"],
        temp_dir=tmp_path / "sweep",  # removed when the sweep exits
    )
    with sweep:
        assert sweep.returns is not None
        job_pids = [r.return_value for r in sweep.returns[0]]
    unpickled_by = [int(p) for p in (tmp_path / "unpickled_by").read_text().split()]
    assert len(job_pids) == 8
    # Each worker process that ran jobs unpickled the shared state exactly once.
    assert sorted(unpickled_by) == sorted(set(job_pids))
    assert len(unpickled_by) < len(job_pids)


def test_ray_init_kwargs_drop_nulls_and_rename_memory() -> None:
    assert ray_init_kwargs({"address": None, "num_cpus": 2, "memory": 10**9}) == {
        "num_cpus": 2,
        "_memory": 10**9,
    }


def test_ray_init_kwargs_ignore_node_resources_when_connecting(
    caplog: pytest.LogCaptureFixture,
) -> None:
    kwargs = ray_init_kwargs(
        {"address": "10.0.0.1:6379", "num_cpus": 4, "num_gpus": 0, "namespace": "sweeps"}
    )
    assert kwargs == {"address": "10.0.0.1:6379", "namespace": "sweeps"}
    assert "hydra.launcher.ray.init.num_cpus=4 is ignored" in caplog.text
    assert ray_init_kwargs({"address": "local", "num_cpus": 4}) == {
        "address": "local",
        "num_cpus": 4,
    }
