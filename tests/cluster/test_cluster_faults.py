"""The cluster launcher when things go wrong, and with batched sweepers: the
cluster it created is torn down on every path, and what finished comes home."""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from ..cluster_harness.fake_hosts import (
    FakeHosts,
    thread_pool_teardown_env,
    unique_cluster_name,
)
from .test_cluster_launcher import NetnsApp, _cluster_yaml, _no_leftovers, _run, _run_test_app


def _on_host(hosts: FakeHosts, host: str, name: str) -> list[Path]:
    """A file of the sweep's jobs on a host: on a cluster the sweep dir (absolute
    here, a path of the launching machine) lives in the launch's temp dir."""
    return list(hosts.host_path(host, "/tmp").glob(f"hydra-ray-*/sweep/{name}"))


@pytest.fixture
def sleepy_sweep(fake_hosts: FakeHosts, tmp_path: Path) -> Iterator[NetnsApp]:
    """Four jobs on the fake cluster's worker: #0 and #1 finish at once, #2 and #3
    sleep 60 s; started and left running once #0 and #1 are done and #2 runs."""
    run = NetnsApp(
        fake_hosts,
        tmp_path,
        "x=1,2,3,4",
        "seconds=0.5",
        "slow_first=[3,4]",
        "hydra.launcher.stop_grace_s=1",  # the sleeping jobs see no KeyboardInterrupt
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(fake_hosts, tmp_path, 'flt')}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    try:
        run.wait_for("Running the jobs from the cluster's head")
        run.wait_until(
            lambda: "[2/4]" in run.output and bool(_on_host(fake_hosts, "worker", "2/started_2")),
            timeout=120,
            what="job #2 running",
        )
        yield run
    finally:
        run.kill()
        fake_hosts.kill_leftovers()
        for leftover in fake_hosts.host_path("worker", "/tmp").glob("hydra-ray-*"):
            shutil.rmtree(leftover)


def _finished_jobs_came_home(fake_hosts: FakeHosts, run: NetnsApp) -> None:
    """What the two finished jobs wrote on the worker is home; the sweep dir is
    one that `resume` continues; nothing is left on the hosts."""
    sweep = run.tmp_path / "sweep"
    for num in (0, 1):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), run.output
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    statuses = [j["status"] for j in summary["jobs"]]
    assert statuses == ["succeeded", "succeeded", "interrupted", "interrupted"]
    assert sorted(p.name for p in (sweep / ".hydra_ray").glob("job_*.pkl")) == [
        "job_0.pkl",
        "job_1.pkl",
    ]
    assert f"hydra.sweep.dir={sweep} hydra.launcher.resume=true" in run.output
    assert "Stopping cluster" in run.output and "Deleted the cluster" in run.output
    _no_leftovers(fake_hosts, sweep)


def test_killed_remote_driver_fails_the_sweep_and_tears_down(
    fake_hosts: FakeHosts, sleepy_sweep: NetnsApp
) -> None:
    killed = fake_hosts.run_on_host("head", ["pkill", "-KILL", "-f", "hydra_ray.driver.head"])
    assert killed.returncode == 0
    assert sleepy_sweep.wait() != 0
    assert "The driver on the cluster's head failed" in sleepy_sweep.output
    _finished_jobs_came_home(fake_hosts, sleepy_sweep)


def test_ctrl_c_during_the_remote_run_tears_down(
    fake_hosts: FakeHosts, sleepy_sweep: NetnsApp
) -> None:
    sleepy_sweep.send(signal.SIGINT)
    assert sleepy_sweep.wait(timeout=120) != 0
    _finished_jobs_came_home(fake_hosts, sleepy_sweep)


def test_sighup_mid_sweep_brings_the_finished_jobs_home_and_tears_down(
    fake_hosts: FakeHosts, sleepy_sweep: NetnsApp
) -> None:
    """The terminal closed or the ssh session dropped: as SIGTERM, not a cluster left running."""
    sleepy_sweep.send(signal.SIGHUP)
    assert sleepy_sweep.wait(timeout=120) != 0
    _finished_jobs_came_home(fake_hosts, sleepy_sweep)


def _torn_down_while_python_was_alive(output: str) -> None:
    """With Ray's teardown going through a thread pool (as for docker clusters), the
    teardown ran before the interpreter's exit, which refuses thread-pool work."""
    assert "cannot schedule new futures" not in output, output
    assert "Deleted the cluster" in output, output


def test_batched_sweeper_creates_the_cluster_once_and_tears_it_down_after_the_last_batch(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    res = _run_test_app(
        fake_hosts,
        tmp_path,
        _cluster_yaml(fake_hosts, tmp_path, "bat"),
        "x=1,2,3,4",
        "hydra/sweeper=basic",
        "hydra.sweeper.max_batch_size=2",
        env=thread_pool_teardown_env(),
    )
    assert res.returncode == 0, res.stdout
    assert res.stdout.count("Ray Launcher is launching 2 jobs") == 2
    assert res.stdout.count("Creating or updating cluster") == 1
    assert res.stdout.count("Stopping cluster") == 1
    _torn_down_while_python_was_alive(res.stdout)
    for num in range(4):
        assert (sweep / str(num) / f"done_{num}.json").is_file()
    _no_leftovers(fake_hosts, sweep)


def _second_job_slow(seconds: int, cluster_yaml: Path, sweep: Path) -> list[str]:
    """A ray_cluster sweep of two jobs: #0 done in half a second, #1 taking
    `seconds` on its first run (a window to break something in)."""
    return [
        "x=1,2",
        "seconds=0.5",
        "slow_first=[2]",
        f"slow_seconds={seconds}",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={cluster_yaml}",
        f"hydra.sweep.dir={sweep}",
    ]


def _killed_then_torn_down(run: NetnsApp, fake_hosts: FakeHosts, name: str, timeout: float) -> str:
    """kill -9 of the launching process (a closed laptop); then no Ray process
    is left on either host within `timeout`: the head's watchdog log."""
    run.kill_group()
    run.wait()
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=timeout) == [], host
    return fake_hosts.host_path("head", f"~/.hydra_ray/autodown/{name}/log").read_text()


def _end(fake_hosts: FakeHosts, *runs: NetnsApp) -> None:
    """After a test that killed things on the shared fake hosts: the apps, what
    they left running, and the launches' temp dirs there (a dead worker keeps its
    killed attempts' files; a cluster torn down by itself keeps its results),
    not for the next tests on these hosts to find."""
    for run in runs:
        run.kill()
    fake_hosts.kill_leftovers()
    for host in ("head", "worker"):
        for leftover in fake_hosts.host_path(host, "/tmp").glob("hydra-ray-*"):
            shutil.rmtree(leftover)


def _resume(fake_hosts: FakeHosts, tmp_path: Path, args: list[str]) -> Any:
    """The same command with hydra.launcher.resume=true; it must succeed."""
    res = _run(
        fake_hosts,
        tmp_path,
        tmp_path / "app",
        "app.py",
        "--multirun",
        *args,
        "hydra.launcher.resume=true",
    )
    assert res.returncode == 0, res.stdout
    return res


def _each_job_home_once(sweep: Path, count: int, output: str) -> None:
    """Each of `count` jobs' files home, each job run once (its runs_N file)."""
    for num in range(count):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), output
        assert len((sweep / str(num) / f"runs_{num}").read_text().split()) == 1, num


def test_a_killed_launcher_leaves_the_jobs_running_and_a_resume_brings_them_home(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """kill -9 of the launching process mid-sweep (no handler runs, as when the
    laptop's lid closes): the driver on the head goes on with the jobs; the same
    command with resume=true follows it again, brings every output home, runs
    no job twice and tears the cluster down."""
    sweep = tmp_path / "sweep"
    args = [
        "x=1,2,3",
        "seconds=0.5",
        "slow_first=[2,3]",
        "slow_seconds=20",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(fake_hosts, tmp_path, 'kil')}",
        f"hydra.sweep.dir={sweep}",
    ]
    run = NetnsApp(fake_hosts, tmp_path, *args)
    try:
        run.wait_for("follows it again and brings everything home")
        deadline = time.monotonic() + 120
        run.wait_until(
            lambda: bool(_on_host(fake_hosts, "worker", "2/started_2")),
            timeout=120,
            what="job #2 started",
        )
        # The launcher and its ssh sessions to the head, as when the laptop goes.
        run.kill_group()
        run.wait()
        # Without the launcher, the slow jobs still end (and the driver gathers
        # what they wrote on the worker onto the head).
        while not _on_host(fake_hosts, "head", "2/done_2.json"):
            assert time.monotonic() < deadline + 60, run.output
            time.sleep(0.5)
        assert not (sweep / "2" / "done_2.json").exists()
        res = _resume(fake_hosts, tmp_path, args)
        assert "Re-attaching to the driver (" in res.stdout, res.stdout
        _each_job_home_once(sweep, 3, res.stdout)
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 3
        assert [j["return_value"] for j in summary["jobs"]] == [10, 20, 30]
        assert "Deleted the cluster" in res.stdout, res.stdout
        _no_leftovers(fake_hosts, sweep)
    finally:
        run.kill()
        fake_hosts.kill_leftovers()


def test_a_cluster_whose_launcher_is_gone_tears_itself_down_once_idle(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """kill -9 of the launching process mid-sweep and nobody comes back: the
    driver on the head finishes the jobs, and once the cluster has run nothing
    for hydra.launcher.autodown_minutes it tears itself down with Ray's own
    teardown: no Ray process is left on either host, and the head's watchdog
    log says why. The submission log said when, at the earliest."""
    cluster_yaml = _cluster_yaml(fake_hosts, tmp_path, "adn")
    name = yaml.safe_load(cluster_yaml.read_text())["cluster_name"]
    run = NetnsApp(
        fake_hosts,
        tmp_path,
        *_second_job_slow(8, cluster_yaml, tmp_path / "sweep"),
        "hydra.launcher.autodown_minutes=0.2",
    )
    try:
        run.wait_for("started on 127.0.0.3")
        assert "then it tears itself down with them" in run.output, run.output
        # The key that sets it, by its name on the command line.
        assert "0.2 min (hydra.launcher.autodown_minutes)" in run.output, run.output
        assert "(not before " in run.output, run.output
        log = _killed_then_torn_down(run, fake_hosts, name, timeout=180)
        assert "tearing the cluster down" in log, log
        # Not before the driver had ended: the jobs finished, and their results
        # waited on the head (kept on these hosts' disks, gone with a cloud's).
        (launch,) = fake_hosts.host_path("head", "/tmp").glob("hydra-ray-*")
        assert (launch / "driver.rc").read_text().strip() == "0"
        assert (launch / "sweep" / "1" / "done_1.json").is_file()
        assert [p for p in fake_hosts.processes("head") if "autodown" in p.cmdline] == []
    finally:
        _end(fake_hosts, run)


def test_results_in_the_storage_let_a_gone_launcher_s_cluster_go_and_a_resume_fetch_them(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """kill -9 of the launching process with sync_down.storage: the driver puts
    the batch's results in the storage as it ends, the cluster tears itself down
    without waiting for autodown_minutes, and the resume fetches the results
    there, creating no cluster: every output home, each job run once, nothing
    left in the storage or on the hosts."""
    # Seen alike by this machine and the head (each fake host has its own /tmp).
    store = Path(tempfile.mkdtemp(prefix="hydra-ray-store-", dir="/var/tmp"))
    sweep = tmp_path / "sweep"
    cluster_yaml = _cluster_yaml(fake_hosts, tmp_path, "sto")
    name = yaml.safe_load(cluster_yaml.read_text())["cluster_name"]
    args = [
        *_second_job_slow(8, cluster_yaml, sweep),
        "hydra.launcher.autodown_minutes=3",
        f"hydra.launcher.sync_down.storage=file://{store}",
    ]
    run = NetnsApp(fake_hosts, tmp_path, *args)
    try:
        run.wait_for("started on 127.0.0.3")
        assert "its results also go to sync_down.storage=file://" in run.output, run.output
        log = _killed_then_torn_down(run, fake_hosts, name, timeout=240)
        idle = re.search(r"idle for (\d+) s", log)
        assert idle is not None and int(idle.group(1)) < 3 * 60, log
        assert not (sweep / "1" / "done_1.json").exists()
        res = _resume(fake_hosts, tmp_path, args)
        assert "Brought home the results of jobs #0, #1 from file://" in res.stdout, res.stdout
        assert "Creating or updating cluster" not in res.stdout, res.stdout
        _each_job_home_once(sweep, 2, res.stdout)
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        assert [j["return_value"] for j in summary["jobs"]] == [10, 20]
        assert list(store.iterdir()) == []
        _no_leftovers(fake_hosts, sweep)
    finally:
        run.kill()
        fake_hosts.kill_leftovers()
        shutil.rmtree(store, ignore_errors=True)
        for host in ("head", "worker"):
            for leftover in fake_hosts.host_path(host, "/tmp").glob("hydra-ray-*"):
                shutil.rmtree(leftover)


def test_a_lost_connection_to_the_head_is_made_again_and_the_sweep_ends_as_usual(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """The ssh session that shows the driver's output dies mid-sweep (a network
    blip): the launcher says so, follows the driver again, and the sweep ends as
    if nothing happened: every output home, each job run once, no cluster left."""
    sweep = tmp_path / "sweep"
    run = NetnsApp(
        fake_hosts,
        tmp_path,
        *_second_job_slow(15, _cluster_yaml(fake_hosts, tmp_path, "rec"), sweep),
    )
    try:
        run.wait_for("#1 : x=2 seconds=0.5 slow_first=[2] slow_seconds=15 started on")
        # The launcher's ssh client that runs the follow command on the head.
        followers = subprocess.run(
            ["pgrep", "-s", str(run.pid), "-f", "^ssh .*tail -n"],
            capture_output=True,
            text=True,
        ).stdout.split()
        assert followers, run.output
        for pid in followers:
            os.kill(int(pid), signal.SIGKILL)
        assert run.wait() == 0, run.output
        assert "Lost the driver's output" in run.output, run.output
        for num in range(2):
            assert (sweep / str(num) / f"done_{num}.json").is_file(), run.output
            assert len((sweep / str(num) / f"runs_{num}").read_text().split()) == 1, num
        assert "Deleted the cluster" in run.output, run.output
        _no_leftovers(fake_hosts, sweep)
    finally:
        run.kill()
        fake_hosts.kill_leftovers()


def test_a_worker_whose_ray_dies_mid_sweep_is_no_reason_to_keep_the_cluster(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """A worker's Ray killed while its jobs run: Ray runs them again on the head,
    every job succeeds and its files come home. The dead worker held only the
    killed attempts' files: the run says so, exits 0 and tears the cluster down."""
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("wdie"),
        num_cpus=2,
        head_args=["--num-cpus=1", "--include-dashboard=false"],
    )
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(config))
    sweep = tmp_path / "sweep"
    run = NetnsApp(
        fake_hosts,
        tmp_path,
        "x=1,2,3",
        "seconds=15",
        "hydra.launcher.ray.remote.max_retries=2",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={cluster_yaml}",
        f"hydra.sweep.dir={sweep}",
    )
    try:
        run.wait_for("started on 127.0.0.3")
        killed = fake_hosts.run_on_host("worker", ["pkill", "-KILL", "-f", "raylet"])
        assert killed.returncode == 0
        assert run.wait(timeout=300) == 0, run.output
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 3, run.output
        for num in range(3):
            assert (sweep / str(num) / f"done_{num}.json").is_file(), run.output
        assert "Node 127.0.0.3 is gone" in run.output, run.output
        assert "NOT ALL OUTPUTS ARE HOME" not in run.output
        assert "Deleted the cluster" in run.output, run.output
    finally:
        _end(fake_hosts, run)


def test_a_worker_whose_ray_dies_after_a_job_finished_there_still_gives_its_outputs(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """A worker's Ray killed right after a job finished there, its disk and ssh
    still up: Ray cannot reach the job's files any more, so the head fetches
    them over ssh, as its autoscaler reaches the node. The job succeeded with
    its outputs home; the job that ran there when Ray died is run again by Ray
    (max_retries) once the autoscaler restarted the node's Ray; the summary and
    the files at home agree; the cluster is torn down, nothing left."""
    sweep = tmp_path / "sweep"
    run = NetnsApp(
        fake_hosts,
        tmp_path,
        *_second_job_slow(30, _cluster_yaml(fake_hosts, tmp_path, "wgone"), sweep),
    )
    try:
        run.wait_until(
            lambda: bool(
                _on_host(fake_hosts, "worker", "0/done_0.json")
                and _on_host(fake_hosts, "worker", "1/started_1")
            ),
            timeout=240,
            what="job #0 done and #1 started on the worker",
        )
        killed = fake_hosts.run_on_host("worker", ["pkill", "-KILL", "-f", "raylet"])
        assert killed.returncode == 0
        assert run.wait(timeout=300) == 0, run.story
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        assert [j["status"] for j in summary["jobs"]] == ["succeeded", "succeeded"], run.story
        assert not any(j.get("outputs_left") for j in summary["jobs"]), run.story
        assert (sweep / "0" / "done_0.json").is_file(), run.story
        assert (sweep / "1" / "done_1.json").is_file(), run.story
        assert "NOT ALL OUTPUTS ARE HOME" not in run.output, run.story
        assert "Could not remove" not in run.output, run.story
        assert "run again by Ray after its first process died" in run.output, run.story
        assert "gathered its job dirs over ssh" in run.output, run.story
        assert "Deleted the cluster" in run.output, run.output
        _no_leftovers(fake_hosts, sweep)
    finally:
        _end(fake_hosts, run)
