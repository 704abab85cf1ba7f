"""The engine on the session's Ray: what it ships and how often, and what a
failure inside the engine's own loop does to the other jobs."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobStatus
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import DictConfig

from hydra_ray.checks.validate import ray_init_kwargs
from hydra_ray.core.held import HeldJobReturn
from hydra_ray.engine.report import SweepProgress

from .conftest import run_app


class UnpickleProbe:
    """Appends the pid of every process that unpickles it to a file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        with open(self.path, "a") as f:
            f.write(f"{os.getpid()}\n")


def sweep_in_process(runner: TSweepRunner, task: Any, tmp_path: Path, *overrides: str) -> Any:
    """Hydra's test sweep of its `compose.yaml` app with `task`, on `ray`; its
    sweep dir, under `tmp_path`, is removed when the sweep exits."""
    return runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=task,
        config_path="configs",
        config_name="compose.yaml",
        overrides=["hydra/launcher=ray", *overrides],
        temp_dir=tmp_path / "sweep",
    )


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_shared_state_is_unpickled_once_per_worker_not_per_job(
    ray_session: str, hydra_sweep_runner: TSweepRunner, tmp_path: Path
) -> None:
    probe = UnpickleProbe(tmp_path / "unpickled_by")

    def task(cfg: DictConfig) -> int:
        assert probe.path  # the task function, and so the probe, is shared state
        return os.getpid()

    sweep = sweep_in_process(hydra_sweep_runner, task, tmp_path, "+a=0,1,2,3,4,5,6,7")
    with sweep:
        assert sweep.returns is not None
        job_pids = [r.return_value for r in sweep.returns[0]]
    unpickled_by = [int(p) for p in (tmp_path / "unpickled_by").read_text().split()]
    assert len(job_pids) == 8
    # Each worker process that ran jobs unpickled the shared state exactly once.
    assert sorted(unpickled_by) == sorted(set(job_pids))
    assert len(unpickled_by) < len(job_pids)


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_a_big_sweep_keeps_a_bounded_number_of_jobs_in_flight_and_loses_none(
    ray_session: str,
    hydra_sweep_runner: TSweepRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each turn of the engine's loop waits on what is in flight, never on the
    whole sweep: with at most 5 in flight (the session's Ray has 2 CPUs), 40
    jobs, four of them retried, all end, in order."""
    import ray

    from hydra_ray.engine import run as _engine

    monkeypatch.setattr(_engine, "IN_FLIGHT_MIN", 5)
    waited_on: list[int] = []
    real_wait = ray.wait

    def wait(refs: list[Any], **kwargs: Any) -> Any:
        waited_on.append(len(refs))
        return real_wait(refs, **kwargs)

    monkeypatch.setattr(ray, "wait", wait)

    marks = tmp_path / "failed_once"
    marks.mkdir()

    def task(cfg: DictConfig) -> int:
        mark = marks / str(cfg.a)
        if cfg.a % 10 == 3 and not mark.exists():
            mark.touch()
            raise ValueError(f"job {cfg.a} fails its first attempt")
        return int(cfg.a) * 2

    sweep = sweep_in_process(
        hydra_sweep_runner, task, tmp_path, "hydra.launcher.retries=1", "+a=range(0,40)"
    )
    with sweep:
        assert sweep.returns is not None
        returns = sweep.returns[0]
        assert [r.overrides for r in returns] == [[f"+a={n}"] for n in range(40)]
        assert all(r.status == JobStatus.COMPLETED for r in returns)
        assert [r.return_value for r in returns] == [2 * n for n in range(40)]
        summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
        retried = [j["idx"] for j in summary["jobs"] if j["attempts"] == 2]
        assert retried == [3, 13, 23, 33]
        assert sorted(p.name for p in marks.iterdir()) == sorted(map(str, retried))
    assert max(waited_on) == 5, waited_on


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_the_sweeper_gets_each_jobs_configs_pickled_until_it_reads_them(
    ray_session: str, hydra_sweep_runner: TSweepRunner, tmp_path: Path
) -> None:
    def task(cfg: DictConfig) -> int:
        return int(cfg.a) + 1

    sweep = sweep_in_process(hydra_sweep_runner, task, tmp_path, "+a=0,1,2")
    with sweep:
        assert sweep.returns is not None
        returns = sweep.returns[0]
        assert all(isinstance(r, HeldJobReturn) for r in returns)
        assert all(r.pickled("cfg") and r.pickled("hydra_cfg") for r in returns)
        assert [r.return_value for r in returns] == [1, 2, 3]
        assert [r.cfg.a for r in returns] == [0, 1, 2]
        assert [r.hydra_cfg.hydra.job.num for r in returns] == [0, 1, 2]
        assert [r.hydra_cfg.hydra.runtime.output_dir for r in returns] == [
            str(tmp_path / "sweep" / str(n)) for n in range(3)
        ]


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


def test_a_job_whose_record_cannot_be_written_is_named_and_the_others_finish(
    ray_session: str, tmp_path: Path
) -> None:
    res = run_app(
        "unpicklable_app.py",
        "x=1,2,3",
        "unpicklable_on=[2]",
        "seconds=1",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert (
        "Could not record the result of job #1 (x=2 unpicklable_on=[2] seconds=1): "
        "TypeError: an Unpicklable cannot be pickled"
    ) in res.output
    assert "hydra.launcher.resume=true would run this job again" in res.output
    records = sorted(p.name for p in (tmp_path / "sweep" / ".hydra_ray").glob("job_*.pkl"))
    assert records == ["job_0.pkl", "job_2.pkl"]
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert summary["counts"] == {"succeeded": 3}


def _gone(pid: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_an_error_that_ends_the_run_leaves_no_job_running(
    ray_session: str,
    hydra_sweep_runner: TSweepRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pid_file = tmp_path / "long_job.pid"

    def task(cfg: DictConfig) -> int:
        if cfg.a == 1:  # runs for minutes unless cancelled
            pid_file.write_text(str(os.getpid()))
            time.sleep(300)
        deadline = time.monotonic() + 120
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # finish only once the long job runs
        return int(cfg.a)

    def broken(self: SweepProgress, outcome: Any) -> None:
        raise RuntimeError("the display broke")

    monkeypatch.setattr(SweepProgress, "finished", broken)
    sweep = hydra_sweep_runner(
        calling_file=None,
        calling_module="hydra.test_utils.a_module",
        task_function=task,
        config_path="configs",
        config_name="compose.yaml",
        overrides=["hydra/launcher=ray", "+a=0,1"],
        temp_dir=tmp_path / "sweep",
    )
    with pytest.raises(RuntimeError, match="the display broke"), sweep:
        pass
    assert _gone(int(pid_file.read_text()), within_s=60), "the long job still runs"


def test_another_plugins_classes_travel_by_value_to_a_python_without_it(tmp_path: Path) -> None:
    # A sweeper plugin of this machine only: its config class types a job's config.
    plugin = tmp_path / "here" / "hydra_plugins" / "elsewhere_sweeper"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text("")
    (plugin / "config.py").write_text(
        "from dataclasses import dataclass\n\n"
        "@dataclass\nclass SweeperConf:\n    n_trials: int = 3\n"
    )
    code = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "from omegaconf import OmegaConf\n"
        "from hydra_plugins.elsewhere_sweeper.config import SweeperConf\n"
        "from hydra_ray.engine.worker import dumps_for_cluster\n"
        "cfg = OmegaConf.create({'hydra': {'sweeper': OmegaConf.structured(SweeperConf)}})\n"
        "sys.stdout.buffer.write(dumps_for_cluster(cfg))\n"
    )
    here = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "here")], capture_output=True, check=True
    )
    # Where the jobs run: no such plugin.
    load = (
        "import sys, cloudpickle; print(cloudpickle.loads(sys.stdin.buffer.read()).hydra.sweeper)"
    )
    there = subprocess.run(
        [sys.executable, "-c", load], input=here.stdout, capture_output=True, cwd=tmp_path
    )
    assert there.returncode == 0, there.stderr.decode()
    assert there.stdout.decode().strip() == "{'n_trials': 3}"
