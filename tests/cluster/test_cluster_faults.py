"""The cluster launcher when things go wrong, and with batched sweepers: the
cluster it created is torn down on every path, and what finished comes home."""

import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..cluster_harness.fake_hosts import FakeHosts, launcher_env
from .test_cluster_launcher import REPO, _cluster_yaml, _no_leftovers, _run_test_app


class RunningApp:
    """A sweep running in the fake hosts' netns, its output read as it comes."""

    def __init__(self, hosts: FakeHosts, tmp_path: Path, *args: str) -> None:
        app = tmp_path / "app"
        shutil.copytree(REPO / "tests" / "apps", app)
        self.tmp_path = tmp_path
        self.lines: list[str] = []
        self.proc = hosts.popen_in_netns(
            [sys.executable, "app.py", "--multirun", *args, "hydra.launcher.env_setup.commands=[]"],
            env=launcher_env(tmp_path),
            cwd=app,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            assert self.proc.poll() is None, f"exited before {text!r}:\n{self.output}"
            assert time.monotonic() < deadline, f"no {text!r} in time:\n{self.output}"
            time.sleep(0.2)

    def wait(self, timeout: float = 240) -> int:
        code = self.proc.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def sleepy_sweep(fake_hosts: FakeHosts, tmp_path: Path) -> Iterator[RunningApp]:
    """Four jobs of 60 s each on the fake cluster, started and left running."""
    run = RunningApp(
        fake_hosts,
        tmp_path,
        "x=1,2,3,4",
        "seconds=60",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(fake_hosts, tmp_path, 'flt')}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    try:
        # The jobs are running on the worker once one has written its start mark.
        run.wait_for("Running the jobs from the cluster's head")
        deadline = time.monotonic() + 120
        worker_sweep = fake_hosts.host_path("worker", tmp_path / "sweep")
        while not list(worker_sweep.glob("*/started_*")):
            assert time.monotonic() < deadline, run.output
            time.sleep(0.5)
        yield run
    finally:
        run.kill()
        fake_hosts.kill_leftovers()
        # Known limit: a sweep stopped before its outputs were gathered leaves its
        # working dir on the worker nodes (cloud nodes are deleted at teardown;
        # on-prem hosts keep it). Removed here so later tests start clean.
        for leftover in fake_hosts.host_path("worker", "/tmp").glob("hydra-ray-*"):
            shutil.rmtree(leftover)


def test_killed_remote_driver_fails_the_sweep_and_tears_down(
    fake_hosts: FakeHosts, sleepy_sweep: RunningApp
) -> None:
    killed = fake_hosts.run_on_host("head", ["pkill", "-KILL", "-f", "_head_driver"])
    assert killed.returncode == 0
    assert sleepy_sweep.wait() != 0
    out = sleepy_sweep.output
    assert "The driver on the cluster's head failed" in out
    assert "Stopping cluster" in out and "Deleted the cluster" in out
    assert list(fake_hosts.host_path("head", "/tmp").glob("hydra-ray-*")) == []
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=60) == [], host


def test_ctrl_c_during_the_remote_run_tears_down(
    fake_hosts: FakeHosts, sleepy_sweep: RunningApp
) -> None:
    interrupted = time.monotonic()
    sleepy_sweep.proc.send_signal(signal.SIGINT)
    assert sleepy_sweep.wait(timeout=120) != 0
    took = time.monotonic() - interrupted
    out = sleepy_sweep.output
    assert "Stopping cluster" in out and "Deleted the cluster" in out, out
    assert took < 60, f"{took:.0f} s from Ctrl-C to exit"
    # A sweep dir that `resume` continues: every job listed, none taken as done.
    sweep = sleepy_sweep.tmp_path / "sweep"
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["interrupted"] * 4
    assert not list((sweep / ".hydra_ray").glob("job_*.pkl"))
    assert f"hydra.sweep.dir={sweep} hydra.launcher.resume=true" in out
    assert list(fake_hosts.host_path("head", "/tmp").glob("hydra-ray-*")) == []
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=60) == [], host


def test_batched_sweeper_creates_the_cluster_once(fake_hosts: FakeHosts, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = _run_test_app(
        fake_hosts,
        tmp_path,
        _cluster_yaml(fake_hosts, tmp_path, "bat"),
        "x=1,2,3,4",
        "hydra/sweeper=basic",
        "hydra.sweeper.max_batch_size=2",
    )
    assert res.returncode == 0, res.stdout
    assert res.stdout.count("Ray Launcher is launching 2 jobs") == 2
    assert res.stdout.count("Creating or updating cluster") == 1
    assert res.stdout.count("Stopping cluster") == 1
    for num in range(4):
        assert (sweep / str(num) / f"done_{num}.json").is_file()
    _no_leftovers(fake_hosts)
