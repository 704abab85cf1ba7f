"""The `ray_jobs` launcher against a real Ray cluster (`ray start --head` with its
dashboard) reached through one forwarded port, as a KubeRay cluster is through
`kubectl port-forward`: the sweep runs there as one Ray job, and every result,
record and output comes home through that port alone."""

import contextlib
import http.server
import importlib.util
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)
from omegaconf import OmegaConf

from hydra_ray.core.records import read_record
from hydra_ray.core.settings import SyncDown
from hydra_ray.infra.scratch import machine_tag
from hydra_ray.launch.sweep import SweepBook, SweepSettings

from .cluster_harness.moto import MotoServer, moto_server
from .conftest import (
    APPS,
    AppProcess,
    AppRun,
    free_port,
    ray_head,
    run_app,
    start_app,
    sweep_key_of,
)
from .port_forward import port_forward
from .real_code import ran_as_its_script

FRESH_SHELL = ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
USER_ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def head_dashboard_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """The dashboard port of a head started as `/venv/bin/ray start` with a PATH
    that does not lead to that venv (a systemd unit, a cron line, a container
    entrypoint): its `python`, if any, lacks what the driver needs, and the
    driver runs under the Python that runs its Ray all the same."""
    home = tmp_path_factory.mktemp("head-home")
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    ours = str(Path(sys.executable).parent)
    env.update(
        HOME=str(home),
        RAY_AUTH_MODE="disabled",
        PATH=os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d != ours),
    )
    port = free_port()
    with ray_head(env, dashboard_port=port):
        yield port


@pytest.fixture(scope="module")
def dashboard(head_dashboard_port: int) -> Iterator[str]:
    """That head's dashboard, through a forwarded port."""
    with port_forward(head_dashboard_port) as forwarded:
        yield f"http://127.0.0.1:{forwarded}"


def _sweep_on_ray_jobs(
    dashboard: str,
    tmp_path: Path,
    *overrides: str,
    env: dict[str, str] | None = None,
    app: str = "app.py",
    sweep_dir: str = "sweep",
) -> AppRun:
    """`app` of tests/apps swept on ray_jobs through `dashboard`, run in `tmp_path`."""
    return run_app(
        app,
        *overrides,
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={dashboard}",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
        env={**USER_ENV, **(env or {})},
        unset=FRESH_SHELL[1:],
        timeout=300,
    )


def test_a_sweep_runs_as_one_ray_job_and_everything_comes_home(
    dashboard: str, tmp_path: Path
) -> None:
    # hydra.job.env_copy copies variables of the environment that composes a
    # job's config: here, this machine's (the cluster's lacks this one, and
    # composing there would fail), so the jobs' configs are composed here.
    res = _sweep_on_ray_jobs(
        dashboard,
        tmp_path,
        "x=1,2,3",
        "raise_on=[3]",
        "hydra.job.env_copy=[HYDRA_RAY_TEST_ANSWER]",
        "returns=[${oc.env:HYDRA_RAY_TEST_ANSWER}]",
        env={"HYDRA_RAY_TEST_ANSWER": "42"},
    )
    assert res.returncode != 0, res.output  # job #2 raises
    out = res.output
    assert "Composing the 3 jobs' configs on this machine: hydra.job.env_copy is set" in out
    assert "Submitted the sweep as Ray job hydra-app-" in out, out
    # The driver's lines stream here: each job's end, the summary table.
    assert "#0 : x=1 raise_on=[3] succeeded" in out or "[1/3]" in out, out
    sweep = tmp_path / "sweep"
    for num in range(3):
        assert (sweep / str(num) / ".hydra" / "config.yaml").is_file(), out
        assert (sweep / str(num) / "app.log").is_file()
        assert (sweep / str(num) / f"done_{num}.json").is_file() == (num != 2)
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded", "succeeded", "failed"]
    assert [j["return_value"] for j in summary["jobs"]] == ["42", 20, None]
    # Where each job's files are here, not where they were on the cluster; in
    # the records too, which a resume hands to the sweeper.
    assert [j["output_dir"] for j in summary["jobs"]] == [str(sweep / str(n)) for n in range(3)]
    record = read_record(sweep, 1, sweep_key_of(sweep))
    assert record is not None and record.job_return.hydra_cfg is not None
    assert record.job_return.hydra_cfg.hydra.runtime.output_dir == str(sweep / "1")
    assert "job 2 was told to raise" in out
    records = sorted(p.name for p in (sweep / ".hydra_ray").glob("job_*.pkl"))
    assert records == ["job_0.pkl", "job_1.pkl", "job_2.pkl"]
    assert "HYDRA_RAY_BUNDLE" not in out
    # Once all is home, the cluster's copies go: the sweep dir the jobs filled
    # in the Ray job's working dir, and the pack (this head's files are visible here).
    _the_cluster_keeps_nothing(dashboard, out)


def test_a_sweep_dir_out_of_the_working_dir_lives_in_the_ray_job_s_dir_and_comes_home(
    dashboard: str, tmp_path: Path
) -> None:
    """hydra.sweep.dir=../elsewhere: on the cluster the jobs write in the Ray
    job's own dir, not beside it, where other sweeps' dirs are; here the files,
    the summary and the records name ../elsewhere."""
    app = tmp_path / "app"
    app.mkdir()
    res = _sweep_on_ray_jobs(dashboard, app, "x=1,2", sweep_dir="../elsewhere")
    assert res.returncode == 0, res.output
    sweep = tmp_path / "elsewhere"
    for num in range(2):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.output
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["output_dir"] for j in summary["jobs"]] == [str(sweep / str(n)) for n in range(2)]
    record = read_record(sweep, 1, sweep_key_of(sweep))
    assert record is not None and record.job_return.hydra_cfg is not None
    assert record.job_return.hydra_cfg.hydra.runtime.output_dir == str(sweep / "1")
    _the_cluster_keeps_nothing(dashboard, res.output)


def test_the_driver_runs_under_the_python_of_the_cluster_s_ray_or_the_one_named(
    dashboard: str, tmp_path: Path
) -> None:
    """The module's head has this venv's Ray and a PATH without this venv: the
    sweeps above ran under its Ray's Python. One named by
    hydra.launcher.entrypoint_python is used instead, and named in the error
    when it lacks what the driver needs (a bare venv here)."""
    bare = tmp_path / "bare"
    venv.create(bare, with_pip=False)
    python = bare / "bin" / "python"
    res = _sweep_on_ray_jobs(
        dashboard, tmp_path, "x=1", f"hydra.launcher.entrypoint_python={python}"
    )
    assert res.returncode != 0, res.output
    assert f"The cluster's Python ({python}) has no module" in res.output, res.output
    assert "hydra.launcher.entrypoint_python" in res.output, res.output
    assert not (tmp_path / "sweep" / "0" / "done_0.json").exists()
    # A Python that is not there at all: named, with the key to set.
    res = _sweep_on_ray_jobs(
        dashboard, tmp_path, "x=1", "hydra.launcher.entrypoint_python=/nowhere/python"
    )
    assert res.returncode != 0, res.output
    assert "The cluster's Python (/nowhere/python) is not there on the head" in res.output
    # And the one of the cluster's Ray: this venv's, although the head's PATH leads elsewhere.
    again = tmp_path / "again"
    again.mkdir()
    res = _sweep_on_ray_jobs(dashboard, again, "x=2")
    assert res.returncode == 0, res.output
    assert (again / "sweep" / "0" / "done_0.json").is_file(), res.output


def _the_cluster_keeps_nothing(dashboard: str, out: str) -> None:
    from ray.job_submission import JobSubmissionClient

    found = re.search(r"removing the sweep's copy on the cluster \(Ray job (\S+),.*\): (.+)", out)
    assert found, out
    cleanup_id, paths = found.group(1), found.group(2).split(", ")
    client = JobSubmissionClient(dashboard)
    deadline = time.monotonic() + 120
    while str(client.get_job_status(cleanup_id)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
        assert time.monotonic() < deadline, client.get_job_logs(cleanup_id)
        time.sleep(0.5)
    assert str(client.get_job_status(cleanup_id)) == "SUCCEEDED", client.get_job_logs(cleanup_id)
    assert any(p.endswith(".tar") for p in paths) and any(p.endswith("/sweep") for p in paths)
    for path in paths:
        assert not os.path.lexists(path), path


def test_a_cleanup_the_network_drops_leaves_the_sweep_done_and_names_what_stays(
    head_dashboard_port: int, tmp_path: Path
) -> None:
    # The forwarder drops the connection that submits the cleanup job (its
    # submission id ends in -cleanup); everything else goes through.
    def cleanup(sent: bytes) -> bool:
        return sent.startswith(b"POST /api/jobs/") and b'-cleanup"' in sent

    with port_forward(head_dashboard_port, cut=cleanup) as port:
        res = _sweep_on_ray_jobs(f"http://127.0.0.1:{port}", tmp_path, "x=1,2")
    assert res.returncode == 0, res.output  # everything is home: the sweep succeeded
    sweep = tmp_path / "sweep"
    for num in range(2):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.output
    found = re.search(
        r"Could not remove the sweep's copy on the cluster \((.*)\): (\S+(?:, \S+)*) "
        r"stay on node (\S+)",
        res.output,
    )
    assert found, res.output
    paths = found.group(2).split(", ")
    # What it names is there, untouched (this head's files are visible here).
    assert any(p.endswith(".tar") for p in paths) and any(p.endswith("/sweep") for p in paths)
    for path in map(Path, paths):
        assert path.exists(), path
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert "Traceback" not in res.output


def test_an_upload_the_network_drops_is_named_and_a_resume_submits_the_sweep(
    head_dashboard_port: int, dashboard: str, tmp_path: Path
) -> None:
    # The forwarder drops the connection that uploads the package: the sweep
    # was never submitted.
    with port_forward(
        head_dashboard_port, cut=lambda sent: sent.startswith(b"PUT /api/packages/")
    ) as port:
        lost = f"http://127.0.0.1:{port}"
        res = _sweep_on_ray_jobs(lost, tmp_path, "x=1,2")
    assert res.returncode != 0
    assert f"Lost the dashboard at {lost} while submitting the sweep as Ray job" in res.output
    assert "hydra.launcher.resume=true submits it again" in res.output
    assert "Traceback" not in res.output, res.output
    sweep = tmp_path / "sweep"
    assert not list(sweep.glob("*/done_*.json"))
    # Once the network is back, the resume submits it and it runs to the end.
    res = _sweep_on_ray_jobs(dashboard, tmp_path, "x=1,2", "hydra.launcher.resume=true")
    assert res.returncode == 0, res.output
    assert "is not on the cluster" in res.output and "its jobs run again" in res.output
    for num in range(2):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.output


def _launching(dashboard: str, cwd: Path, *overrides: str) -> AppProcess:
    """A sweep's launching process on ray_jobs through `dashboard`, started in
    the background, its output read as it comes."""
    return start_app(
        "app.py",
        *overrides,
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={dashboard}",
        "hydra.sweep.dir=sweep",
        cwd=cwd,
        env=USER_ENV,
        unset=FRESH_SHELL[1:],
    )


def test_ctrl_c_stops_the_ray_job_and_brings_home_what_finished(
    dashboard: str, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    # Each job counts its runs here, outside the sweep dir (a rerun is not slow).
    runs = tmp_path / "runs"
    sweep_args = (
        "x=1,2,3",
        "slow_first=[2,3]",
        "hydra.launcher.stop_wait_s=20",
        "hydra.launcher.stop_grace_s=2",  # the sleeping jobs are cancelled by force then
        f"out={runs}",
    )
    run = _launching(dashboard, tmp_path, *sweep_args)
    # Job #0 done, #1 and #2 running (60 s each): Ctrl-C.
    run.wait_until(lambda: "succeeded in" in run.output and run.output.count("started on") == 3)
    out = run.end(signal.SIGINT)
    assert run.returncode != 0, out
    assert "Ctrl-C: stopping Ray job hydra-app-" in out, out
    submission = out.split("Ctrl-C: stopping Ray job ", 1)[1].split()[0]
    client = JobSubmissionClient(dashboard)
    assert str(client.get_job_status(submission)) == "STOPPED"
    sweep = tmp_path / "sweep"
    # What finished came home, with its record; the rest is named interrupted.
    assert (runs / "done_0.json").is_file(), out
    assert (sweep / "0" / ".hydra" / "config.yaml").is_file(), out
    assert (sweep / ".hydra_ray" / "job_0.pkl").is_file()
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert summary["jobs"][0]["status"] == "succeeded"
    assert {j["status"] for j in summary["jobs"][1:]} == {"interrupted"}, summary
    # A resume runs the rest, not job #0 again.
    res = _sweep_on_ray_jobs(dashboard, tmp_path, *sweep_args, "hydra.launcher.resume=true")
    assert res.returncode == 0, res.output
    assert "Re-attaching" not in res.output  # the stopped job's results are home
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 3, summary
    assert [len((runs / f"runs_{n}").read_text().split()) for n in range(3)] == [1, 2, 2]


@pytest.mark.parametrize(
    "lost",
    ["killed, job still running", "killed, job ended meanwhile", "port-forward closed"],
)
def test_a_resume_after_the_launcher_was_lost_follows_the_ray_job_again(
    head_dashboard_port: int, tmp_path: Path, lost: str
) -> None:
    # Each job counts its runs here, outside the sweep dir.
    runs = tmp_path / "runs"
    sweep_args = ("x=1,2,3,4", "seconds=3", f"out={runs}")
    with port_forward(head_dashboard_port) as port:
        dashboard = f"http://127.0.0.1:{port}"
        # Reconnects for 3 s only: the port-forward stays closed longer.
        run = _launching(dashboard, tmp_path, *sweep_args, "hydra.launcher.reconnect_s=3")
        run.wait_for("started on")
        if lost != "port-forward closed":
            out = run.end(signal.SIGKILL)  # kill -9: no Ctrl-C handler, nothing brought home
    if lost == "port-forward closed":  # every connection through it cut
        assert run.wait(timeout=120) != 0, run.output
        out = run.end(signal.SIGKILL)
        assert f"Lost the dashboard at {dashboard} while following Ray job" in out, out
        assert "tried again for 3 s, hydra.launcher.reconnect_s" in out, out
        assert "the sweep goes on on the cluster" in out and "Traceback" not in out
    assert "hydra.launcher.resume=true follows it again" in out, out
    # A kill -9 runs no cleanup: the launcher's scratch dir (its staged package) stays...
    scratch = f"hydra-ray-jobs-{machine_tag()}-{run.pid}-*"
    left = list(Path(tempfile.gettempdir()).glob(scratch))
    assert len(left) == (0 if lost == "port-forward closed" else 1), left
    # The same port again, as when `kubectl port-forward` is started anew.
    with port_forward(head_dashboard_port, listen_port=port):
        _resume_follows_the_ray_job(
            dashboard, tmp_path, out, sweep_args, wait_end=lost == "killed, job ended meanwhile"
        )
    # ... until the next launch.
    assert list(Path(tempfile.gettempdir()).glob(scratch)) == []


def test_a_port_forward_restarted_mid_sweep_is_followed_again_by_the_same_run(
    head_dashboard_port: int, tmp_path: Path
) -> None:
    """The port-forward closes mid-sweep and comes back on the same port (as
    `kubectl port-forward` restarted): the launcher follows the Ray job again by
    itself, shows no line twice, and the sweep ends as usual."""
    runs = tmp_path / "runs"
    with port_forward(head_dashboard_port) as port:
        dashboard = f"http://127.0.0.1:{port}"
        run = _launching(dashboard, tmp_path, "x=1,2,3,4", "seconds=3", f"out={runs}")
        run.wait_for("started on")
    time.sleep(2)
    with port_forward(head_dashboard_port, listen_port=port):
        assert run.wait(timeout=180) == 0, run.output
    out = run.end(signal.SIGKILL)
    assert f"Lost the dashboard at {dashboard}" in out and "following Ray job" in out, out
    assert "again in 1 s" in out, out
    assert [len((runs / f"runs_{n}").read_text().split()) for n in range(4)] == [1] * 4
    # Each job's start is shown once: the lines before the drop not again.
    started = [line for line in out.splitlines() if " started on " in line]
    assert len(started) == len(set(started)) == 4, out
    sweep = tmp_path / "sweep"
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 4


def _resume_follows_the_ray_job(
    dashboard: str, tmp_path: Path, out: str, sweep_args: tuple[str, ...], wait_end: bool
) -> None:
    from ray.job_submission import JobSubmissionClient

    runs = tmp_path / "runs"
    submission = out.split("Submitted the sweep as Ray job ", 1)[1].split()[0]
    client = JobSubmissionClient(dashboard)
    assert str(client.get_job_status(submission)) in ("PENDING", "RUNNING")
    sweep = tmp_path / "sweep"
    assert not list(sweep.glob(".hydra_ray/job_*.pkl"))
    if wait_end:
        deadline = time.monotonic() + 120
        while str(client.get_job_status(submission)) != "SUCCEEDED":
            assert time.monotonic() < deadline
            time.sleep(0.5)
    res = _sweep_on_ray_jobs(dashboard, tmp_path, *sweep_args, "hydra.launcher.resume=true")
    assert res.returncode == 0, res.output
    assert f"Re-attaching to Ray job {submission}" in res.output, res.output
    assert "Submitted the sweep" not in res.output
    # No job ran twice; every job's result and files came home.
    assert sorted(p.name for p in runs.glob("runs_*")) == [f"runs_{n}" for n in range(4)]
    assert [len((runs / f"runs_{n}").read_text().split()) for n in range(4)] == [1] * 4
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["return_value"] for j in summary["jobs"]] == [10, 20, 30, 40], summary
    assert [j["output_dir"] for j in summary["jobs"]] == [str(sweep / str(n)) for n in range(4)]
    for num in range(4):
        assert (sweep / str(num) / ".hydra" / "config.yaml").is_file()
        assert (sweep / ".hydra_ray" / f"job_{num}.pkl").is_file()


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("ray://127.0.0.1:10001", "use hydra/launcher=ray with"),
        ("127.0.0.1:6379", "is not a dashboard address"),
        (None, "hydra.launcher.address is not set"),
    ],
    ids=["ray client", "gcs", "none"],
)
def test_an_address_that_is_no_dashboard_is_refused_with_the_launcher_to_use(
    tmp_path: Path, address: str | None, says: str
) -> None:
    key = [] if address is None else [f"hydra.launcher.address={address}"]
    res = run_app("app.py", "x=1", "hydra/launcher=ray_jobs", *key, cwd=tmp_path, unset=FRESH_SHELL)
    assert res.returncode != 0
    assert says in res.output, res.output
    assert "Submitted" not in res.output and "Uploading package" not in res.output


def _refused_before_anything(tmp_path: Path, *overrides: str) -> AppRun:
    """A one-job ray_jobs sweep to an address where nothing listens, with
    `overrides`: refused, with nothing submitted or uploaded."""
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        "hydra.launcher.address=http://127.0.0.1:1",
        *overrides,
        cwd=tmp_path,
        unset=FRESH_SHELL,
        timeout=60,
    )
    assert res.returncode != 0
    assert "Submitted" not in res.output and "Uploading package" not in res.output
    return res


@pytest.mark.parametrize("wait", ["-1", "inf", "soon"])
def test_an_agent_wait_that_cannot_work_is_refused_with_its_key(tmp_path: Path, wait: str) -> None:
    res = _refused_before_anything(tmp_path, f"hydra.launcher.agent_wait_s={wait}")
    assert "hydra.launcher.agent_wait_s=" in res.output, res.output


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("hydra.launcher.headers='Bearer abc123'", "hydra.launcher.headers is not valid: it is a"),
        (
            "hydra.launcher.verify=/nonexistent/ca.pem",
            "hydra.launcher.verify=/nonexistent/ca.pem: no such CA bundle",
        ),
    ],
)
def test_headers_or_a_ca_bundle_that_cannot_work_are_refused_with_their_key(
    tmp_path: Path, override: str, said: str
) -> None:
    res = _refused_before_anything(tmp_path, override)
    assert said in res.output, res.output
    assert "Traceback" not in res.output and "abc123" not in res.output


def test_a_stop_wait_shorter_than_the_jobs_grace_is_refused_naming_both_keys(
    tmp_path: Path,
) -> None:
    res = _refused_before_anything(tmp_path, "hydra.launcher.stop_grace_s=60")
    says = "hydra.launcher.stop_wait_s=60 is too short for hydra.launcher.stop_grace_s=60"
    assert says in res.output and "at least 65" in res.output, res.output


def test_a_package_over_ray_s_upload_limit_is_refused_before_the_upload(
    dashboard: str, tmp_path: Path
) -> None:
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "huge.bin").write_bytes(b"\0" * (101 * 2**20))
    (code / "model.py").write_text("x = 1\n")
    res = _sweep_on_ray_jobs(
        dashboard, tmp_path, "x=1", f"hydra.launcher.sync_up.source_dir={code}"
    )
    assert res.returncode != 0
    assert "over Ray's upload limit of 100 MiB" in res.output, res.output
    assert "data/huge.bin (101.0 MiB)" in res.output
    assert "hydra.launcher.sync_up.exclude" in res.output
    assert "Submitted" not in res.output and not (tmp_path / "sweep" / "0").exists()
    # With the big dir left out, the package fits and the sweep runs.
    res = _sweep_on_ray_jobs(
        dashboard,
        tmp_path,
        "x=1",
        f"hydra.launcher.sync_up.source_dir={code}",
        "hydra.launcher.sync_up.exclude=[data]",
        "hydra.launcher.sync_down.exclude=[*.log]",
    )
    assert res.returncode == 0, res.output
    assert (tmp_path / "sweep" / "0" / "done_0.json").is_file()
    # What sync_down left out is not here: the cluster keeps its copy of the sweep.
    assert not (tmp_path / "sweep" / "0" / "app.log").exists()
    assert "holds what sync_down's include/exclude left out" in res.output, res.output


def test_a_cluster_with_token_auth_takes_the_user_s_token_and_refuses_a_wrong_one(
    tmp_path: Path,
) -> None:
    token = secrets.token_hex(32)
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    env.update(
        HOME=str(tmp_path / "head-home"),
        RAY_AUTH_MODE="token",
        RAY_AUTH_TOKEN=token,
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    port = free_port()
    with ray_head(env, dashboard_port=port), port_forward(port) as forwarded:
        address = f"http://127.0.0.1:{forwarded}"

        def sweep(home: Path, **env: str) -> AppRun:
            home.mkdir(exist_ok=True)
            return run_app(
                "app.py",
                "x=1,2",
                "hydra/launcher=ray_jobs",
                f"hydra.launcher.address={address}",
                "hydra.sweep.dir=sweep",
                cwd=tmp_path,
                # A user's shell: no RAY_AUTH_MODE, which Ray's own client needs.
                env={"HOME": str(home), **env},
                unset=tuple(k for k in FRESH_SHELL if k not in env),
            )

        res = sweep(tmp_path / "no-token")
        assert res.returncode != 0
        assert f"The dashboard at {address} requires a token" in res.output, res.output
        assert "RAY_AUTH_TOKEN" in res.output and "Traceback" not in res.output
        # Refused before the sweep began: Hydra's multirun.yaml alone is there.
        assert [p.name for p in (tmp_path / "sweep").iterdir()] == ["multirun.yaml"]
        res = sweep(tmp_path / "no-token", RAY_AUTH_TOKEN="not-" + token)
        assert res.returncode != 0
        assert "refused the token from RAY_AUTH_TOKEN" in res.output, res.output
        assert "Uploading package" not in res.output
        # The token where `ray start` or `ray get-auth-token` leaves it.
        home = tmp_path / "user-home"
        (home / ".ray").mkdir(parents=True)
        (home / ".ray" / "auth_token").write_text(token + "\n")
        res = sweep(home)
        assert res.returncode == 0, res.output
        summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
        assert [j["status"] for j in summary["jobs"]] == ["succeeded", "succeeded"]
        # The outputs came home through the dashboard's log API, token sent there too.
        for num in range(2):
            assert (tmp_path / "sweep" / str(num) / f"done_{num}.json").is_file()
        from ray.job_submission import JobSubmissionClient

        client = JobSubmissionClient(address, headers={"Authorization": f"Bearer {token}"})
        # The refused runs submitted nothing: the sweep's Ray job and its cleanup alone.
        ids = sorted(str(j.submission_id) for j in client.list_jobs())
        assert len(ids) == 2 and ids[1] == f"{ids[0]}-cleanup", ids


def sweep_to(address: str, tmp_path: Path) -> AppRun:
    """A one-job ray_jobs sweep to `address`, in a fresh shell's environment."""
    return run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={address}",
        cwd=tmp_path,
        unset=FRESH_SHELL,
    )


def test_a_dashboard_out_of_reach_or_another_server_is_named_before_anything_is_staged(
    tmp_path: Path,
) -> None:
    def sweep(address: str) -> AppRun:
        return sweep_to(address, tmp_path)

    # Nothing listens here, as when the port-forward is not running.
    address = f"http://127.0.0.1:{free_port()}"
    res = sweep(address)
    assert res.returncode != 0
    assert f"Cannot reach the dashboard at {address} (hydra.launcher.address)" in res.output
    assert "port-forward" in res.output and "Traceback" not in res.output, res.output
    # An HTTP server that is no dashboard (another port of the cluster, a proxy's page).
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        res = sweep(address)
    finally:
        server.shutdown()
        server.server_close()
    assert res.returncode != 0
    assert f"{address} (hydra.launcher.address) answered, but not as a Ray dashboard" in res.output
    assert "Traceback" not in res.output, res.output


class _RefusesUploads(http.server.BaseHTTPRequestHandler):
    """A dashboard, as Ray's client sees it, whose package upload fails (a full
    disk on the head, a proxy's limit): 500 to every PUT."""

    def do_GET(self) -> None:
        import ray

        if self.path == "/api/version":
            body = {"version": "4", "ray_version": ray.__version__, "ray_commit": "x"}
            self._answer(200, json.dumps(body).encode())
        else:
            self._answer(404, b"not found")

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(500, b"upload failed: no space left on device")

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class _AsksForAToken(_RefusesUploads):
    """As _RefusesUploads, and with token authentication: 401 to every request
    without `Bearer <TOKEN>`. Notes every request's Authorization header."""

    TOKEN = secrets.token_hex(16)
    asks = True
    seen: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        if self._authorized():
            super().do_GET()

    def do_PUT(self) -> None:
        if self._authorized():
            super().do_PUT()

    def _authorized(self) -> bool:
        said = self.headers.get("Authorization") or ""
        type(self).seen.append(said)
        if self.asks and said != f"Bearer {self.TOKEN}":
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer(401, b"Unauthorized: missing or invalid token")
            return False
        return True


class _NeverAsks(_AsksForAToken):
    asks = False
    seen: ClassVar[list[str]] = []


@pytest.mark.parametrize("handler", [_NeverAsks, _AsksForAToken])
def test_this_machine_s_token_goes_only_to_a_dashboard_that_asks_for_it(
    tmp_path: Path, handler: type[_AsksForAToken]
) -> None:
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(_AsksForAToken.TOKEN)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        res = run_app(
            "app.py",
            "x=1",
            "hydra/launcher=ray_jobs",
            f"hydra.launcher.address={address}",
            cwd=tmp_path,
            env={"HOME": str(home)},
            unset=FRESH_SHELL,
        )
    finally:
        server.shutdown()
        server.server_close()
    # Both took the upload (the one asking, with the token), and refused it.
    assert "upload failed: no space left on device" in res.output, res.output
    sent = [said for said in handler.seen if said]
    if handler is _NeverAsks:
        assert handler.seen and sent == []
    else:
        assert handler.seen[0] == "" and set(sent) == {f"Bearer {_AsksForAToken.TOKEN}"}


def test_a_token_is_not_sent_in_clear_to_another_machine_unless_the_user_says_so(
    tmp_path: Path,
) -> None:
    """Under RAY_AUTH_MODE=token the token goes from the first request: to an http
    address that is not loopback (a name that never resolves: nothing is sent
    anywhere), the launcher refuses, naming what to do."""
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        "hydra.launcher.address=http://dashboard.invalid:8265",
        cwd=tmp_path,
        env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "abc123"},
        unset=("RAY_ADDRESS", "RAY_AUTH_TOKEN_PATH"),
        timeout=60,
    )
    assert res.returncode != 0
    assert "would cross the network in clear" in res.output, res.output
    assert "hydra.launcher.token_over_http=true" in res.output and "abc123" not in res.output


def test_a_dashboard_that_refuses_the_upload_is_named_with_its_answer(tmp_path: Path) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _RefusesUploads)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        address = f"http://127.0.0.1:{server.server_address[1]}"
        res = sweep_to(address, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert res.returncode != 0
    said = f"The dashboard at {address} (hydra.launcher.address) refused the sweep's upload"
    assert said in res.output, res.output
    assert "upload failed: no space left on device" in res.output
    assert "Nothing runs on the cluster" in res.output and "Traceback" not in res.output
    assert "Submitted the sweep" not in res.output


def test_the_example_sends_its_code_and_gets_each_job_s_return_value_and_files(
    dashboard: str, tmp_path: Path
) -> None:
    app = tmp_path / "jobs_api"
    shutil.copytree(Path(__file__).parents[1] / "examples" / "jobs_api", app)
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL[1:]}

    def run(*overrides: str) -> "subprocess.CompletedProcess[str]":
        return subprocess.run(
            [sys.executable, "train.py", "--multirun", "lr=0.1,0.01", *overrides],
            cwd=app,
            env={**env, **USER_ENV},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=300,
        )

    # Without its code, the driver on the cluster cannot load train.py's main.
    res = run(f"hydra.launcher.address={dashboard}", "hydra.launcher.sync_up.source_dir=null")
    assert res.returncode != 0
    assert "The cluster's Python has no module 'model'" in res.stdout, res.stdout
    assert "hydra.launcher.sync_up.source_dir" in res.stdout
    assert "Traceback" not in res.stdout.split("without the jobs' results")[-1]
    res = run(f"hydra.launcher.address={dashboard}", "hydra.sweep.dir=multirun/a")
    assert res.returncode == 0, res.stdout
    sweep = app / "multirun" / "a"
    # model.py travelled with the Ray job: the jobs imported it there.
    assert "lr=0.01: loss" in res.stdout
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    spec = importlib.util.spec_from_file_location("example_model", app / "model.py")
    assert spec is not None and spec.loader is not None
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    got = [j["return_value"] for j in summary["jobs"]]
    assert got == [model.loss_after(5, 0.1), model.loss_after(5, 0.01)]
    for num, lr in enumerate(["0.1", "0.01"]):
        assert (sweep / str(num) / "checkpoint.txt").read_text().startswith(f"lr={lr} ")


def _trainer_sent(*include: str) -> list[str]:
    """sync_up of tests/apps, sending only `include`."""
    listed = ",".join(f"'{name}'" for name in include)
    return [
        f"hydra.launcher.sync_up.source_dir={APPS}",
        f"hydra.launcher.sync_up.include=[{listed}]",
        "hydra.launcher.sync_up.exclude=['*']",
    ]


def test_a_job_runs_as_its_script_would_from_the_code_sent_with_the_ray_job(
    dashboard: str, tmp_path: Path
) -> None:
    res = _sweep_on_ray_jobs(
        dashboard, tmp_path, "x=1,2", *_trainer_sent("trainer.py", "trainer.yaml"), app="trainer.py"
    )
    assert res.returncode == 0, res.output
    assert "is not in what hydra.launcher.sync_up sends" not in res.output
    reports = ran_as_its_script(tmp_path / "sweep", [["x=1"], ["x=2"]])
    # The script as the Ray job's working dir holds it on the node, not this checkout's.
    scripts = {r["argv"][0] for r in reports}
    assert len(scripts) == 1 and str(APPS) not in scripts.pop(), scripts
    assert all(r["argv"][0].endswith("/code/trainer.py") for r in reports)


def test_a_script_that_sync_up_leaves_out_is_named_and_its_jobs_still_pickle(
    dashboard: str, tmp_path: Path
) -> None:
    res = _sweep_on_ray_jobs(
        dashboard,
        tmp_path,
        "x=1",
        "relaunch=false",
        *_trainer_sent("trainer.yaml"),
        app="trainer.py",
    )
    assert res.returncode == 0, res.output
    assert "The app's script trainer.py is not in what hydra.launcher.sync_up sends" in res.output
    assert "add 'trainer.py' to hydra.launcher.sync_up.include" in res.output
    ran_as_its_script(tmp_path / "sweep", [["x=1", "relaunch=False"]], relaunched=False)


def test_each_job_gets_the_cpus_its_own_config_asks_for_on_the_cluster(
    dashboard: str, tmp_path: Path
) -> None:
    """hydra.launcher.ray.remote.num_cpus: ${model.cpus}, resolved per job by the
    driver on the cluster (the head has 2 CPUs and no GPU: GPUs and disks off)."""
    res = _sweep_on_ray_jobs(
        dashboard,
        tmp_path,
        "model=small,large",
        "hydra.launcher.ray.remote.num_gpus=0",
        "hydra.launcher.ray.remote.resources=null",
        app="resources_app.py",
    )
    assert res.returncode == 0, res.output
    sweep = tmp_path / "sweep"
    got = [json.loads((sweep / str(n) / "resources.json").read_text()) for n in range(2)]
    assert [g["assigned"] for g in got] == [{"CPU": 1.0}, {"CPU": 2.0}], res.output
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["resources"] for j in summary["jobs"]] == [{"CPU": 1.0}, {"CPU": 2.0}]


# ---- A sweeper that learns from the results: Hydra's Optuna sweeper.


def test_an_optuna_sweep_learns_from_the_return_values_of_jobs_run_on_the_cluster(
    dashboard: str, tmp_path: Path, optuna_sweeper: Path
) -> None:
    path = os.pathsep.join(p for p in (str(optuna_sweeper), os.environ.get("PYTHONPATH")) if p)
    res = run_app(
        "app.py",
        "hydra/sweeper=optuna",
        "x=choice(1,2,3)",
        "hydra.sweeper.n_trials=4",
        "hydra.sweeper.n_jobs=2",
        "hydra.sweeper.direction=minimize",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={dashboard}",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
        env={**USER_ENV, "PYTHONPATH": path},
        unset=FRESH_SHELL[1:],
        timeout=300,
    )
    assert res.returncode == 0, res.output
    # Two batches of two trials: a Ray job each, the second asked for after the first's values.
    assert res.output.count("Submitted the sweep as Ray job") == 2, res.output
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    xs = [int(j["overrides"][0].removeprefix("x=")) for j in summary["jobs"]]
    values = [j["return_value"] for j in summary["jobs"]]
    assert len(values) == 4 and values == [10 * x for x in xs]
    results = OmegaConf.load(tmp_path / "sweep" / "optimization_results.yaml")
    assert results.best_value == min(values) and results.best_params.x == min(xs)


# ---- sync_down.storage: the pack through S3 (moto's server) or a shared volume.

BUCKET = "sweep-packs"


@pytest.fixture(scope="module")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    """moto's S3 on loopback, with a bucket for the packs."""
    with moto_server(tmp_path_factory.mktemp("moto-home"), region="us-east-1") as server:
        server.client("s3").create_bucket(Bucket=BUCKET)
        yield server


def _s3_uri(server: MotoServer, bucket: str = BUCKET) -> str:
    host = server.endpoint.removeprefix("http://")
    return f"s3://{bucket}/packs?endpoint_override={host}&scheme=http&region={server.region}"


_CREDENTIALS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "NO_PROXY")


def _storage_overrides(server: MotoServer, uri: str) -> list[str]:
    """sync_down.storage, and the credentials for the cluster's driver (this
    machine's come from its environment)."""
    creds = ",".join(f"{k}:'{server.env[k]}'" for k in _CREDENTIALS)
    return [
        f"hydra.launcher.sync_down.storage='{uri}'",
        f"+hydra.launcher.runtime_env={{env_vars:{{{creds}}}}}",
    ]


@pytest.mark.parametrize("where", ["s3", "file"])
def test_sync_down_storage_carries_the_pack_and_is_emptied_once_it_is_home(
    dashboard: str, s3: MotoServer, tmp_path: Path, where: str
) -> None:
    shared = tmp_path / "shared"  # a volume both sides mount at one path
    shared.mkdir()
    uri = f"file://{shared}" if where == "file" else _s3_uri(s3)
    res = run_app(
        "app.py",
        "x=1,2",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={dashboard}",
        "hydra.sweep.dir=sweep",
        *_storage_overrides(s3, uri),
        cwd=tmp_path,
        env={**USER_ENV, **{k: s3.env[k] for k in _CREDENTIALS}},
        unset=FRESH_SHELL[1:],
        timeout=300,
    )
    assert res.returncode == 0, res.output
    assert "Put the results (" in res.output, res.output
    sweep = tmp_path / "sweep"
    for num in range(2):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.output
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["return_value"] for j in summary["jobs"]] == [10, 20]
    # Once home, the storage's copy is gone.
    if where == "file":
        assert list(shared.iterdir()) == []
    else:
        found = s3.client("s3").list_objects_v2(Bucket=BUCKET).get("Contents", [])
        # pyarrow keeps the prefix as an empty "packs/" marker: no data in it.
        assert [o["Key"] for o in found if not o["Key"].endswith("/")] == []


def test_a_storage_lost_mid_sweep_sends_the_pack_through_the_dashboard(
    dashboard: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(moto_server(tmp_path / "moto-home", region="us-east-1"))
        server.client("s3").create_bucket(Bucket=BUCKET)
        for key in _CREDENTIALS:
            monkeypatch.setenv(key, server.env[key])
        run = _launching(
            dashboard,
            tmp_path,
            "x=1,2",
            "seconds=3",
            *_storage_overrides(server, _s3_uri(server)),
        )
        run.wait_for("started on")
        stack.close()  # S3 goes away while the jobs run: the driver cannot put the pack
        try:
            assert run.wait(timeout=240) == 0, run.output
        finally:
            out = run.end(signal.SIGKILL)
    assert "could not be put in sync_down.storage" in out, out
    assert "comes home through the dashboard instead" in out
    for num in range(2):
        assert (tmp_path / "sweep" / str(num) / f"done_{num}.json").is_file(), out


def test_a_storage_this_machine_cannot_reach_is_refused_before_submitting(
    s3: MotoServer, tmp_path: Path
) -> None:
    # Credentials in the URI (pyarrow takes them there): never printed.
    with_keys = _s3_uri(s3, bucket="no-such-bucket").replace("s3://", "s3://testing:s3cr3t@")
    for uri, says in (
        (with_keys, "no bucket 'no-such-bucket' is there"),
        (f"file://{tmp_path}/not-mounted", "the shared volume must be mounted"),
        ("ftp2://host/dir", "is not a storage pyarrow can open"),
    ):
        res = run_app(
            "app.py",
            "x=1",
            "hydra/launcher=ray_jobs",
            # Nothing listens here: the refusal comes before any request to it.
            f"hydra.launcher.address=http://127.0.0.1:{free_port()}",
            f"hydra.launcher.sync_down.storage='{uri}'",
            cwd=tmp_path,
            env={k: s3.env[k] for k in _CREDENTIALS},
            unset=FRESH_SHELL,
        )
        assert res.returncode != 0
        assert "hydra.launcher.sync_down.storage=" in res.output, res.output
        assert says in res.output, res.output
        assert "Cannot reach the dashboard" not in res.output and "s3cr3t" not in res.output


def test_a_pack_that_cannot_be_fetched_from_storage_stays_there_and_is_named(
    tmp_path: Path,
) -> None:
    from hydra_ray.core.errors import OutputsNotHomeError
    from hydra_ray.core.jobs import Policy
    from hydra_ray.core.wire import PACK_MARK
    from hydra_ray.infra.dashboard import Dashboard
    from hydra_ray.launch import jobs_api as _jobs_api

    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "hydra-app-1.tar").write_bytes(b"not the pack the driver made")
    where = {"storage": f"file://{shared}", "key": "hydra-app-1.tar", "size": 10, "sha256": "0"}
    logs = f"a log line\n{PACK_MARK}{json.dumps(where)}\n"  # the driver's last line
    down = SyncDown(target_dir=None, include=[], exclude=[], storage=f"file://{shared}")
    book = SweepBook(tmp_path / "sweep", [], SweepSettings(False, False, Policy()))
    dashboard = Dashboard("http://127.0.0.1:1", {}, True)
    with pytest.raises(OutputsNotHomeError, match=r"damaged.*they stay in file://"):
        _jobs_api._bring_pack_home(
            dashboard, "hydra-app-1", _jobs_api._pack_location(logs), down, book, tmp_path
        )
    assert (shared / "hydra-app-1.tar").is_file()  # nothing removed that did not come home


# ---- Hydra's own conformance suites, against the forwarded dashboard.


@pytest.fixture
def _to_the_dashboard(dashboard: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The launcher reads the address as `ray job submit` does, when the key is null.
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", dashboard)


@pytest.mark.usefixtures("_to_the_dashboard")
@pytest.mark.parametrize("launcher_name, overrides", [("ray_jobs", [])])
class TestRayJobsLauncher(LauncherTestSuite):
    pass


@pytest.mark.usefixtures("_to_the_dashboard")
@pytest.mark.parametrize(
    "launcher_name, overrides",
    [("ray_jobs", ["hydra/sweeper=basic", "hydra.sweeper.max_batch_size=2"])],
)
class TestRayJobsLauncherBatched(BatchedSweeperTestSuite):
    pass


@pytest.fixture
def extra_flags(dashboard: str) -> list[str]:
    return ["-m", f"hydra.launcher.address={dashboard}"]


@pytest.mark.parametrize(
    "task_launcher_cfg",
    [{"defaults": [{"override hydra/launcher": "ray_jobs"}, "_self_"]}],
)
class TestRayJobsLauncherIntegration(IntegrationTestSuite):
    # Two tests of the suite print a job's os.getcwd() / to_absolute_path() and
    # expect the launching machine's dirs: a ray_jobs job runs on the cluster, in
    # the Ray job's working dir (where the shipped code is), so these cannot hold
    # for it (nor for any launcher whose jobs run on other machines). The sweep
    # dir's contents coming home is asserted by the tests above instead.
    test_custom_sweeper_run_workdir = None  # type: ignore[assignment]
    test_to_absolute_path_multirun = None  # type: ignore[assignment]


def test_a_dry_run_plans_the_ray_job_and_sends_nothing(tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    (code / "model.py").write_text("x = 1\n")
    (code / "notes.txt").write_text("left out\n")
    # Nothing listens at the address: a dry run makes no request.
    address = f"http://127.0.0.1:{free_port()}"
    res = run_app(
        "app.py",
        "x=1,2",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={address}",
        f"hydra.launcher.sync_up.source_dir={code}",
        "hydra.launcher.sync_up.include=[*.py]",
        "hydra.launcher.sync_up.exclude=[*]",
        "hydra.launcher.dry_run=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        unset=FRESH_SHELL,
    )
    assert res.returncode == 0, res.output
    assert "Dry run of the ray_jobs launcher: nothing was started" in res.output
    assert f"one Ray job per batch, submitted to the dashboard at {address}" in res.output
    assert "code: 1 files" in res.output and "model.py" in res.output
    assert "notes.txt" not in res.output
    assert "2 jobs (each config composed and resolved)" in res.output
    # Every problem at once: the address and a bad setting.
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        "hydra.launcher.address=ray://127.0.0.1:10001",
        "hydra.launcher.retries=-1",
        "hydra.launcher.dry_run=true",
        cwd=tmp_path,
        unset=FRESH_SHELL,
    )
    assert res.returncode != 0
    assert "Dry run: 2 problems would stop this sweep" in res.output, res.output


def test_a_dashboard_without_a_job_agent_is_named_after_a_short_wait(tmp_path: Path) -> None:
    # The head's job agent cannot start: its port is taken (as by another Ray).
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    env.update(HOME=str(home), RAY_AUTH_MODE="disabled")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        # Ray's raylet may share the fate of the agent that failed, and `ray start`
        # then fails itself (seen on a loaded CI run): a head to test against is
        # started again, up to 3 times.
        for attempt in range(3):
            port = free_port()
            try:
                with ray_head(env, dashboard_port=port, agent_port=taken.getsockname()[1]):
                    res = _sweep_on_ray_jobs(
                        f"http://127.0.0.1:{port}", tmp_path, "x=1", "hydra.launcher.agent_wait_s=3"
                    )
                break
            except AssertionError as exc:
                if "ray start failed" not in str(exc) or attempt == 2:
                    raise
    assert res.returncode != 0
    # Asked again for a while, then named (not Ray's bare HTTP 500).
    assert "The cluster's job agent is not up yet: submitting again in 2 s" in res.output
    assert "has no job agent to run the sweep (it said" in res.output, res.output
    assert "job' for 3 s)" in res.output and "raise hydra.launcher.agent_wait_s" in res.output
    assert "dashboard_agent.log" in res.output and "Submitted the sweep" not in res.output
