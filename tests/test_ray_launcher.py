"""The `ray` launcher's behaviour, seen as a user sees it: real Hydra apps run as
subprocesses on a real Ray."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from .conftest import APPS, SMALL_RAY, processes_in_session, ray_head, run_app, start_app

REPO = Path(__file__).parent.parent
# Ray 2.60 token authentication, off for a cluster and the apps that join it.
NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}


def _records(out: Path) -> dict[int, dict[str, Any]]:
    return {int(p.stem.split("_")[1]): json.loads(p.read_text()) for p in out.glob("done_*.json")}


def _max_concurrency(records: list[dict[str, Any]]) -> int:
    events = sorted([(r["start"], 1) for r in records] + [(r["end"], -1) for r in records])
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    return peak


def test_failed_and_killed_jobs_do_not_stop_the_others(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2,3,4",
        "raise_on=[2]",
        "die_on=[3]",
        "seconds=0.5",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode != 0
    # The jobs that did not fail ran to the end and left their outputs.
    assert sorted(_records(sweep / "0")) + sorted(_records(sweep / "3")) == [0, 3]
    for num in range(4):
        assert (sweep / str(num) / ".hydra" / "config.yaml").exists() or num == 2
    # Hydra reports the first failure, as with the basic launcher...
    assert "ValueError: job 1 was told to raise" in res.output
    # ...and the job whose process died is named, with its overrides and cause.
    assert "Job #2 (x=3 raise_on=[2] die_on=[3] seconds=0.5) did not complete" in res.output
    assert "WorkerCrashedError" in res.output
    assert "4 jobs done" in res.output and "2 succeeded, 2 failed (#1, #2)" in res.output


def test_a_job_that_ray_ran_again_after_its_process_died_says_so(
    ray_session: str, tmp_path: Path
) -> None:
    sweep, out = tmp_path / "sweep", tmp_path / "out"
    res = run_app(
        "app.py",
        "x=1,2",
        "die_first=[2]",
        f"out={out}",
        "hydra.launcher.ray.remote.max_retries=1",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert len((out / "runs_1").read_text().splitlines()) == 2  # killed once, then succeeded
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert [(j["status"], j["attempts"], j["ray_reruns"]) for j in jobs] == [
        ("succeeded", 1, 0),
        ("succeeded", 1, 1),
    ]
    assert "run again by Ray after its first process died" in res.output
    assert re.search(r"^\| 1 \| .*\| +1 \+1 Ray \|", res.output, flags=re.MULTILINE), res.output


def test_a_failed_job_keeps_its_traceback_in_its_log(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    run_app(
        "app.py",
        "x=1,2",
        "raise_on=[2]",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    log = (sweep / "1" / "app.log").read_text()
    assert "Job #1 failed" in log and 'raise ValueError(f"job {num} was told to raise")' in log


def test_batches_share_one_ray_and_number_jobs_on(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2,3,4,5",
        "hydra/sweeper=basic",
        "hydra.sweeper.max_batch_size=2",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert res.output.count("Initializing ray with config") == 1
    assert res.output.count("Ray Launcher is launching 2 jobs") == 2
    for num, x in enumerate([1, 2, 3, 4, 5]):
        hydra_cfg = OmegaConf.load(sweep / str(num) / ".hydra" / "hydra.yaml")
        assert hydra_cfg.hydra.job.num == num
        assert _records(sweep / str(num))[num]["x"] == x


@pytest.mark.parametrize(("task_cpus", "expected_concurrency"), [(2, 1), (1, 2)])
def test_remote_resources_limit_concurrency(
    ray_session: str, tmp_path: Path, task_cpus: int, expected_concurrency: int
) -> None:
    # The session's Ray has 2 CPUs: jobs that each take 2 run one at a time.
    out = tmp_path / "out"
    res = run_app(
        "app.py",
        "x=1,2,3,4",
        "seconds=1",
        f"out={out}",
        f"hydra.sweep.dir={tmp_path / 's'}",
        f"hydra.launcher.ray.init.address={ray_session}",
        f"hydra.launcher.ray.remote.num_cpus={task_cpus}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    records = list(_records(out).values())
    assert len(records) == 4
    assert _max_concurrency(records) == expected_concurrency


def test_ctrl_c_cancels_jobs_and_stops_ray(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with start_app(
        "app.py",
        "x=1,2,3,4",
        "seconds=120",
        f"out={out}",
        f"hydra.sweep.dir={tmp_path / 's'}",
        # The sleeping jobs see no KeyboardInterrupt: their grace only delays the exit.
        "hydra.launcher.stop_grace_s=1",
        *SMALL_RAY,
        cwd=tmp_path,
    ) as run:
        run.wait_until(lambda: len(list(out.glob("started_*"))) >= 2, 120, "jobs started")
        running = processes_in_session(run.pid)
        assert any("raylet" in p for p in running), running
        output = run.end(signal.SIGINT, timeout=60)
        assert "Interrupted: cancelling 4 unfinished jobs" in output
        time.sleep(1)  # processes killed by Ray's shutdown may take a moment to be reaped
        assert processes_in_session(run.pid) == []
    assert list(out.glob("done_*")) == []


@pytest.fixture
def existing_cluster() -> Iterator[tuple[str, int]]:
    """A Ray cluster started with `ray start --head` on this machine, without token
    authentication; yields its address and the session id of its processes."""
    with ray_head({**os.environ, **NO_TOKEN}) as head:
        yield head


def test_runs_on_an_existing_cluster_with_the_guides_command_line(
    existing_cluster: tuple[str, int], tmp_path: Path
) -> None:
    address, head_sid = existing_cluster
    out = tmp_path / "out"
    # The guide's command line, verbatim apart from the address.
    res = run_app(
        "app.py",
        "x=1,2",
        f"out={out}",
        f"hydra.sweep.dir={tmp_path / 's'}",
        f"hydra.launcher.ray.init.address={address}",
        "hydra.launcher.ray.init.num_cpus=4",
        "hydra.launcher.ray.init.num_gpus=0",
        "hydra.launcher.ray.remote.memory=1024000000",
        cwd=tmp_path,
        env=NO_TOKEN,
    )
    assert res.returncode == 0, res.output
    assert f"Initializing ray with config: {{'address': '{address}'}}" in res.output
    assert "hydra.launcher.ray.init.num_cpus=4 is ignored" in res.output
    # The jobs ran in the cluster's own worker processes.
    records = _records(out)
    assert sorted(records) == [0, 1]
    assert {r["sid"] for r in records.values()} == {head_sid}


def test_connection_errors_say_why(ray_session: str, tmp_path: Path) -> None:
    # The session's Ray requires a token; a driver that turned tokens off is refused.
    res = run_app(
        "app.py",
        "x=1",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
        env=NO_TOKEN,
    )
    assert res.returncode != 0
    assert "requires a token, and RAY_AUTH_MODE=disabled here turns tokens off" in res.output
    assert "hydra.launcher.ray.init.address" in res.output


def test_config_keys_of_the_guide_exist_without_plus(tmp_path: Path) -> None:
    res = subprocess.run(
        [
            sys.executable,
            str(APPS / "app.py"),
            "hydra.launcher.ray.init.num_cpus=4",
            "hydra.launcher.ray.remote.memory=1024000000",
            "+hydra.launcher.ray.init.foo=bar",
            "--cfg",
            "hydra",
            "-p",
            "hydra.launcher",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stderr
    printed = OmegaConf.create(res.stdout)
    assert printed._target_ == "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    assert printed.ray.init == {**printed.ray.init, "address": None, "num_cpus": 4, "foo": "bar"}
    assert printed.ray.remote.memory == 1024000000
    assert printed.ray.remote.num_gpus is None


def test_bad_values_name_the_key_before_any_job_runs(ray_session: str, tmp_path: Path) -> None:
    res = run_app("app.py", "x=1", "hydra.launcher.ray.init.num_cpus=lots", cwd=tmp_path)
    assert res.returncode != 0
    assert "hydra.launcher.ray.init.num_cpus" in res.output and "lots" in res.output

    out = tmp_path / "out"
    res = run_app(
        "app.py",
        "x=1",
        f"out={out}",
        "+hydra.launcher.ray.remote.num_cpuz=1",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "hydra.launcher.ray.remote is not valid for ray.remote()" in res.output
    assert "num_cpuz" in res.output
    assert not out.exists()


def test_plugin_discovery_does_not_import_ray() -> None:
    code = (
        "import sys\n"
        "from hydra.core.plugins import Plugins\n"
        "from hydra.core.config_store import ConfigStore\n"
        "from hydra.plugins.launcher import Launcher\n"
        "names = [p.__name__ for p in Plugins.instance().discover(Launcher)]\n"
        "assert 'RayLauncher' in names, names\n"
        "assert 'ray.yaml' in ConfigStore.instance().list('hydra/launcher')\n"
        "heavy = [m for m in ('ray', 'boto3', 'botocore') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


def test_example_simple_runs_on_local_ray(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "simple" / "my_app.py"),
            "--multirun",
            "task=1,2,3",
            "hydra/launcher=ray",
            f"hydra.sweep.dir={sweep}",
            f"hydra.launcher.ray.init.address={ray_session}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stderr
    for num in range(3):
        assert f"Executing task {num + 1}" in (sweep / str(num) / "my_app.log").read_text()


def test_nothing_of_ours_warns_at_discovery_in_workers_or_per_job(
    ray_session: str, tmp_path: Path
) -> None:
    """On Hydra 1.3 / OmegaConf 2.3 and on Hydra 1.4 / OmegaConf 2.4 (scripts/test.sh
    runs this test on both)."""
    res = run_app(
        "app.py", "x=1,2,3", f"hydra.launcher.ray.init.address={ray_session}", cwd=tmp_path
    )
    assert res.returncode == 0, res.output
    ours = [
        line
        for line in res.output.splitlines()
        if ("hydra_ray_launcher" in line and "Warning" in line) or "plugins scanner" in line
    ]
    assert ours == [], res.output
