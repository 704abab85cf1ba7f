"""The `ray_jobs` launcher against a real Ray cluster (`ray start --head` with its
dashboard) reached through one forwarded port, as a KubeRay cluster is through
`kubectl port-forward`: the sweep runs there as one Ray job, and every result,
record and output comes home through that port alone."""

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hydra.test_utils.launcher_common_tests import (
    BatchedSweeperTestSuite,
    IntegrationTestSuite,
    LauncherTestSuite,
)

from .conftest import APPS, AppRun, free_port, ray_head, run_app
from .port_forward import port_forward

FRESH_SHELL = ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
USER_ENV = {"RAY_AUTH_MODE": "disabled"}


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The forwarded dashboard address of a head whose `python` is this venv's."""
    home = tmp_path_factory.mktemp("head-home")
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    env.update(
        HOME=str(home),
        RAY_AUTH_MODE="disabled",
        PATH=f"{Path(sys.executable).parent}:{env['PATH']}",
    )
    port = free_port()
    with ray_head(env, dashboard_port=port), port_forward(port) as forwarded:
        yield f"http://127.0.0.1:{forwarded}"


def _sweep(dashboard: str, tmp_path: Path, *overrides: str) -> AppRun:
    return run_app(
        "app.py",
        *overrides,
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={dashboard}",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
        env=USER_ENV,
        unset=FRESH_SHELL[1:],
        timeout=300,
    )


def test_a_sweep_runs_as_one_ray_job_and_everything_comes_home(
    dashboard: str, tmp_path: Path
) -> None:
    res = _sweep(dashboard, tmp_path, "x=1,2,3", "raise_on=[3]")
    assert res.returncode != 0, res.output  # job #2 raises
    out = res.output
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
    assert "job 2 was told to raise" in out
    records = sorted(p.name for p in (sweep / ".hydra_ray").glob("job_*.pkl"))
    assert records == ["job_0.pkl", "job_1.pkl", "job_2.pkl"]
    assert "HYDRA_RAY_BUNDLE" not in out


class Launching:
    """A sweep's launching process, started in the background, its output read
    as it comes."""

    def __init__(self, dashboard: str, cwd: Path, *overrides: str) -> None:
        env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL[1:]}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(APPS / "app.py"),
                "--multirun",
                *overrides,
                "hydra/launcher=ray_jobs",
                f"hydra.launcher.address={dashboard}",
                "hydra.sweep.dir=sweep",
            ],
            cwd=cwd,
            env={**env, **USER_ENV, "RAY_USAGE_STATS_ENABLED": "0"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        self.lines.extend(self.proc.stdout)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, done: Callable[[str], bool], timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not done(self.output):
            assert self.proc.poll() is None and time.monotonic() < deadline, self.output
            time.sleep(0.2)

    def end(self, sig: int, timeout: float = 120) -> str:
        """Send `sig`, wait for the end; the whole output."""
        try:
            self.proc.send_signal(sig)
            self.proc.wait(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                os.killpg(self.proc.pid, signal.SIGKILL)
        self._reader.join(timeout=10)
        return self.output


def test_ctrl_c_stops_the_ray_job_and_brings_home_what_finished(
    dashboard: str, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    # Each job counts its runs here, outside the sweep dir (a rerun is not slow).
    runs = tmp_path / "runs"
    sweep_args = ("x=1,2,3", "slow_first=[2,3]", "hydra.launcher.stop_wait_s=20", f"out={runs}")
    run = Launching(dashboard, tmp_path, *sweep_args)
    # Job #0 done, #1 and #2 running (60 s each): Ctrl-C.
    run.wait_for(lambda out: "succeeded in" in out and out.count("started on") == 3)
    out = run.end(signal.SIGINT)
    assert run.proc.returncode != 0, out
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
    res = _sweep(dashboard, tmp_path, *sweep_args, "hydra.launcher.resume=true")
    assert res.returncode == 0, res.output
    assert "Re-attaching" not in res.output  # the stopped job's results are home
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 3, summary
    assert [len((runs / f"runs_{n}").read_text().split()) for n in range(3)] == [1, 2, 2]


@pytest.mark.parametrize("ended", [False, True], ids=["still running", "ended meanwhile"])
def test_a_resume_after_the_launcher_was_killed_follows_the_ray_job_again(
    dashboard: str, tmp_path: Path, ended: bool
) -> None:
    from ray.job_submission import JobSubmissionClient

    # Each job counts its runs here, outside the sweep dir.
    runs = tmp_path / "runs"
    sweep_args = ("x=1,2,3,4", "seconds=3", f"out={runs}")
    run = Launching(dashboard, tmp_path, *sweep_args)
    run.wait_for(lambda out: "started on" in out)
    out = run.end(signal.SIGKILL)  # kill -9: no Ctrl-C handler, nothing brought home
    assert "hydra.launcher.resume=true follows it again" in out, out
    submission = out.split("Submitted the sweep as Ray job ", 1)[1].split()[0]
    client = JobSubmissionClient(dashboard)
    assert str(client.get_job_status(submission)) in ("PENDING", "RUNNING")
    sweep = tmp_path / "sweep"
    assert not list(sweep.glob(".hydra_ray/job_*.pkl"))
    if ended:
        deadline = time.monotonic() + 120
        while str(client.get_job_status(submission)) != "SUCCEEDED":
            assert time.monotonic() < deadline
            time.sleep(0.5)
    res = _sweep(dashboard, tmp_path, *sweep_args, "hydra.launcher.resume=true")
    assert res.returncode == 0, res.output
    assert f"Re-attaching to Ray job {submission}" in res.output, res.output
    assert "Submitted the sweep" not in res.output
    # No job ran twice; every job's result and files came home.
    assert sorted(p.name for p in runs.glob("runs_*")) == [f"runs_{n}" for n in range(4)]
    assert [len((runs / f"runs_{n}").read_text().split()) for n in range(4)] == [1] * 4
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["return_value"] for j in summary["jobs"]] == [10, 20, 30, 40], summary
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


def test_a_package_over_ray_s_upload_limit_is_refused_before_the_upload(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "data").mkdir(parents=True)
    (code / "data" / "huge.bin").write_bytes(b"\0" * (101 * 2**20))
    (code / "model.py").write_text("x = 1\n")
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        # Nothing listens here: the refusal must come before any request.
        f"hydra.launcher.address=http://127.0.0.1:{free_port()}",
        f"hydra.launcher.sync_up.source_dir={code}",
        cwd=tmp_path,
        unset=FRESH_SHELL,
    )
    assert res.returncode != 0
    assert "over Ray's upload limit of 100 MiB" in res.output, res.output
    assert "data/huge.bin (101.0 MiB)" in res.output
    assert "hydra.launcher.sync_up.exclude" in res.output
    # With the big dir left out, the package fits: the run gets as far as the address.
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address=http://127.0.0.1:{free_port()}",
        f"hydra.launcher.sync_up.source_dir={code}",
        "hydra.launcher.sync_up.exclude=[data]",
        cwd=tmp_path,
        unset=FRESH_SHELL,
    )
    assert res.returncode != 0
    assert "upload limit" not in res.output and "127.0.0.1" in res.output, res.output


def test_the_example_sends_its_code_and_gets_each_job_s_return_value_and_files(
    dashboard: str, tmp_path: Path
) -> None:
    app = tmp_path / "jobs_api"
    shutil.copytree(Path(__file__).parents[1] / "examples" / "jobs_api", app)
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL[1:]}
    res = subprocess.run(
        [
            sys.executable,
            "train.py",
            "--multirun",
            "lr=0.1,0.01",
            f"hydra.launcher.address={dashboard}",
            "hydra.sweep.dir=multirun/a",
        ],
        cwd=app,
        env={**env, **USER_ENV, "RAY_USAGE_STATS_ENABLED": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
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
        port = free_port()
        with ray_head(env, dashboard_port=port, agent_port=taken.getsockname()[1]):
            started = time.monotonic()
            res = _sweep(f"http://127.0.0.1:{port}", tmp_path, "x=1")
            took = time.monotonic() - started
    assert res.returncode != 0
    assert "has no job agent to run the sweep" in res.output, res.output
    assert "Submitted the sweep" not in res.output
    assert took < 60, f"{took:.0f} s"
