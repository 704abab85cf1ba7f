"""Resources per job: `hydra.launcher.ray.remote` interpolating into each job's
own config (`num_gpus: ${model.gpus}`), resolved per job, on a real local Ray
that declares GPUs and a custom resource (Ray accepts declared GPUs a machine
does not have); and `hydra.launcher.max_concurrent_jobs`."""

import json
from pathlib import Path
from typing import Any

import pytest
from hydra.test_utils.test_utils import TSweepRunner
from omegaconf import DictConfig

from hydra_ray.core.errors import JobError

from .conftest import SMALL_RAY, AppRun, run_app
from .test_engine import sweep_in_process

# A local Ray of its own: 3 CPUs, 2 GPUs, one "disk".
GPU_RAY = [
    "hydra.launcher.ray.init.num_cpus=3",
    "hydra.launcher.ray.init.num_gpus=2",
    "+hydra.launcher.ray.init.resources={disk: 1}",
    "hydra.launcher.ray.init.include_dashboard=false",
]


def _resources_sweep(tmp_path: Path, *overrides: str, **kwargs: Any) -> AppRun:
    return run_app("resources_app.py", *overrides, "hydra.sweep.dir=sweep", cwd=tmp_path, **kwargs)


def _got(sweep: Path, num: int) -> dict[str, Any]:
    got: dict[str, Any] = json.loads((sweep / str(num) / "resources.json").read_text())
    return got


def test_each_job_gets_the_resources_its_own_config_asks_for(tmp_path: Path) -> None:
    res = _resources_sweep(tmp_path, "model=small,large,half", *GPU_RAY)
    assert res.returncode == 0, res.output
    sweep = tmp_path / "sweep"
    small, large, half = (_got(sweep, n) for n in range(3))
    assert [g["model"] for g in (small, large, half)] == ["small", "large", "half"]
    assert small["assigned"] == {"CPU": 1.0}
    assert large["assigned"] == {"CPU": 2.0, "GPU": 1.0, "disk": 1.0}
    assert half["assigned"] == {"CPU": 1.0, "GPU": 0.5}
    # Ray gives a GPU task its devices; a task without GPUs gets none.
    assert small["cuda_visible_devices"] in (None, "")
    assert large["cuda_visible_devices"] in ("0", "1")
    assert half["cuda_visible_devices"] in ("0", "1")
    # What each job asked for: in its started line, the table and the summary.
    out = res.output
    assert "#1 : model=large started on" in out
    assert "with {CPU: 2, GPU: 1, disk: 1}" in out and "with {CPU: 1, GPU: 0.5}" in out
    assert "| resources" in out and "{CPU: 2, GPU: 1, disk: 1}" in out
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["resources"] for j in summary["jobs"]] == [
        {"CPU": 1.0},
        {"CPU": 2.0, "GPU": 1.0, "disk": 1.0},
        {"CPU": 1.0, "GPU": 0.5},
    ]


def test_a_sweep_without_per_job_values_shows_no_resources(
    ray_session: str, tmp_path: Path
) -> None:
    res = run_app(
        "app.py",
        "x=1,2",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.ray.remote.num_cpus=1",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert " with {" not in res.output and "| resources" not in res.output
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert [j["resources"] for j in summary["jobs"]] == [None, None]


def test_a_value_that_does_not_resolve_for_a_job_is_refused_before_ray_starts(
    tmp_path: Path,
) -> None:
    res = _resources_sweep(tmp_path, "model=small,nogpus,large", *GPU_RAY, timeout=120)
    assert res.returncode != 0
    out = res.output
    assert (
        "Job #1 (model=nogpus): hydra.launcher.ray.remote.num_gpus=${model.gpus} does not "
        "resolve in this job's config" in out
    ), out
    assert "oc.select" in out  # the fix: a default
    assert "Traceback" not in out
    assert "Initializing ray" not in out
    assert not (tmp_path / "sweep" / "0").exists()


def test_a_set_of_resources_no_node_has_is_refused_before_any_job_runs(tmp_path: Path) -> None:
    res = _resources_sweep(tmp_path, "model=small,huge", *GPU_RAY, timeout=120)
    assert res.returncode != 0
    out = res.output
    assert "No node can run job #1 on this Ray" in out, out
    assert "'GPU': 4.0" in out and "hydra.launcher.ray.remote" in out
    assert "started on" not in out
    assert not (tmp_path / "sweep" / "0" / "resources.json").exists()


def test_the_dry_run_lists_the_resources_of_each_job_and_every_problem(tmp_path: Path) -> None:
    res = _resources_sweep(
        tmp_path,
        "model=small,large,half,huge,nogpus,small",
        *GPU_RAY,
        "hydra.launcher.dry_run=true",
        timeout=120,
    )
    assert res.returncode != 0
    out = res.output
    assert "jobs #0, #5: {CPU: 1}" in out, out
    assert "job #1: {CPU: 2, GPU: 1, disk: 1}" in out
    assert "job #2: {CPU: 1, GPU: 0.5}" in out
    assert "Job #4 (model=nogpus): hydra.launcher.ray.remote.num_gpus" in out
    assert "hydra.launcher.ray.remote.num_gpus=4.0 (job #3): the local Ray has 2 GPUs" in out
    assert "Initializing ray" not in out


@pytest.mark.usefixtures("hydra_restore_singletons")
def test_a_job_resolved_as_it_is_submitted_fails_alone_when_its_value_does_not_resolve(
    ray_session: str,
    hydra_sweep_runner: TSweepRunner,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past the time the launcher resolves jobs ahead (none here), a job whose
    value does not resolve fails with the same words; the others run."""
    from hydra_ray.checks import resources as _resources

    monkeypatch.setattr(_resources, "AHEAD_S", 0.0)

    def task(cfg: DictConfig) -> str:
        return str(cfg.a)

    sweep = sweep_in_process(
        hydra_sweep_runner,
        task,
        tmp_path,
        f"hydra.launcher.ray.init.address={ray_session}",
        "+cpus={one: 1, half: 0.5}",
        # Hydra instantiates the launcher from the sweep's own config, which has no
        # `a`: it must resolve there too.
        "hydra.launcher.ray.remote.num_cpus='${cpus.${oc.select:a,one}}'",
        "+a=one,none,half",
    )
    # Hydra's basic sweeper raises the failed job's error once the batch is done.
    with (
        pytest.raises(
            JobError, match=r"Job #1 \(.*\+a=none\): hydra.launcher.ray.remote.num_cpus="
        ),
        sweep,
    ):
        pass
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded", "failed", "succeeded"]
    assert [j["return_value"] for j in summary["jobs"]] == ["one", None, "half"]
    assert [j["resources"] for j in summary["jobs"]] == [{"CPU": 1.0}, None, {"CPU": 0.5}]
    assert "does not resolve in this job's config" in summary["jobs"][1]["error"]


def _overlaps(sweep: Path, count: int) -> int:
    """The most jobs that ran at the same time, from the times they recorded."""
    spans = [json.loads((sweep / f"done_{n}.json").read_text()) for n in range(count)]
    events = sorted([(s["start"], 1) for s in spans] + [(s["end"], -1) for s in spans])
    most = running = 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        most = max(most, running)
    return most


@pytest.mark.parametrize("cap, cpus", [(1, "1"), (2, "0.5")])
def test_max_concurrent_jobs_caps_how_many_jobs_run_at_once(
    ray_session: str, tmp_path: Path, cap: int, cpus: str
) -> None:
    """On the session's Ray (2 CPUs), jobs of 1 CPU could run two at once and jobs
    of 0.5 CPU four at once: the cap holds them to `cap`."""
    out = tmp_path / "out"
    res = run_app(
        "app.py",
        "x=1,2,3,4,5,6",
        "seconds=0.5",
        f"out={out}",
        f"hydra.launcher.ray.init.address={ray_session}",
        f"hydra.launcher.ray.remote.num_cpus={cpus}",
        f"hydra.launcher.max_concurrent_jobs={cap}",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert _overlaps(out, 6) == cap


@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_cap_that_cannot_work_is_refused_naming_the_key(tmp_path: Path, value: str) -> None:
    res = run_app(
        "app.py", "x=1", f"hydra.launcher.max_concurrent_jobs={value}", *SMALL_RAY, cwd=tmp_path
    )
    assert res.returncode != 0
    assert f"hydra.launcher.max_concurrent_jobs={value} is not valid" in res.output, res.output
    assert "Initializing ray" not in res.output


def test_two_jobs_that_hold_a_whole_gpu_at_once_see_different_devices(tmp_path: Path) -> None:
    """CUDA_VISIBLE_DEVICES, which a training framework reads, names each job's own GPU."""
    res = _resources_sweep(
        tmp_path,
        "model=large,large",
        "seconds=2",
        "hydra.launcher.ray.init.num_cpus=4",
        "hydra.launcher.ray.init.num_gpus=2",
        "+hydra.launcher.ray.init.resources={disk: 2}",
        "hydra.launcher.ray.init.include_dashboard=false",
    )
    assert res.returncode == 0, res.output
    sweep = tmp_path / "sweep"
    got = [_got(sweep, n) for n in range(2)]
    assert got[0]["start"] < got[1]["end"] and got[1]["start"] < got[0]["end"]  # at once
    assert sorted(g["cuda_visible_devices"] for g in got) == ["0", "1"], res.output
