"""The `ray` launcher on an existing cluster of other machines (fake hosts, each
with its own filesystem), through Ray Client (`ray://`): the jobs' configs are
composed here, the jobs run there, and every job's outputs come home from the
node that ran it, and only those."""

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from ..cluster_harness.fake_hosts import (
    FakeHosts,
    call_in_netns,
    launcher_env,
    unique_cluster_name,
)
from ..port_forward import port_forward

REPO = Path(__file__).parents[2]
NODES = ("head", "worker")
DASHBOARD = 8265
# Four jobs of a second, spread: together, on both nodes' CPU.
SPREAD = ("x=1,2,3,4", "seconds=1", "hydra.launcher.ray.remote.scheduling_strategy=SPREAD")


@pytest.fixture(scope="module")
def running_cluster(
    fake_hosts: FakeHosts, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A cluster started with `ray up` once for this module's tests (a CPU on
    the head and one on the worker: jobs run on both; a dashboard on the head's
    port 8265); yields the head's address; `ray down` after the last test."""
    tmp_path = tmp_path_factory.mktemp("ext-cluster")
    head_args = [f"--dashboard-host={fake_hosts.address('head')}", f"--dashboard-port={DASHBOARD}"]
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("ext"), num_cpus=1, head_args=head_args
    )
    config["setup_commands"] = []
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(config))
    ray_cli = str(Path(sys.executable).parent / "ray")
    env = launcher_env(tmp_path)
    up = fake_hosts.run_in_netns([ray_cli, "up", "-y", str(cluster_yaml)], env=env, timeout=300)
    try:
        assert up.returncode == 0, up.stdout
        address = f"{fake_hosts.address('head')}:10001"
        _wait_until_ready(fake_hosts, address, {**env, "RAY_AUTH_MODE": "disabled"})
        yield address
    finally:
        fake_hosts.run_in_netns([ray_cli, "down", "-y", str(cluster_yaml)], env=env, timeout=300)
        fake_hosts.kill_leftovers()


def _wait_until_ready(hosts: FakeHosts, address: str, env: dict[str, str]) -> None:
    """Until Ray Client answers and both nodes are in."""
    _probe_until(
        hosts,
        address,
        env,
        "print('READY' if sum(n['Alive'] for n in ray.nodes()) == 2 else 'NOT YET')",
        deadline_s=180,
    )


def _wait_until_idle(hosts: FakeHosts, address: str, tmp_path: Path) -> None:
    """Until every CPU of the cluster is free again (a test's detached actor
    may hold one for a while after its sweep), so that the next test's jobs
    can go to both nodes."""
    free = "ray.available_resources().get('CPU', 0) >= ray.cluster_resources()['CPU']"
    env = {**launcher_env(tmp_path), "RAY_AUTH_MODE": "disabled"}
    _probe_until(hosts, address, env, f"print('READY' if {free} else 'NOT YET')", deadline_s=120)


def _probe_until(
    hosts: FakeHosts, address: str, env: dict[str, str], check: str, *, deadline_s: float
) -> None:
    """Run `check` (Python that prints READY when it holds) through Ray Client
    until it prints READY. A probe that fails to connect is tried again: Ray
    Client's proxier may fail to start a per-client server on a loaded machine
    ("Starting Ray client server failed", "psutil.ZombieProcess"), which says
    nothing of the cluster under test."""
    probe = f"import ray, sys\nray.init(sys.argv[1])\n{check}\nray.shutdown()\n"
    deadline = time.monotonic() + deadline_s
    while True:
        res = hosts.run_in_netns(
            [sys.executable, "-c", probe, f"ray://{address}"], env=env, timeout=120
        )
        if res.returncode == 0 and "READY" in res.stdout.split():
            return
        assert time.monotonic() < deadline, res.stdout
        time.sleep(2)


def _sweep_on_existing_cluster(
    hosts: FakeHosts, address: str, tmp_path: Path, app: str, *overrides: str
) -> subprocess.CompletedProcess[str]:
    """Run tests/apps/`app` on the cluster through Ray Client, its sweep dir tmp_path/sweep."""
    app_dir = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app_dir)
    cmd = [sys.executable, app, "--multirun", *overrides, "hydra/launcher=ray"]
    cmd += [f"hydra.launcher.ray.init.address=ray://{address}"]
    res = hosts.run_in_netns(
        [*cmd, f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        env={**launcher_env(tmp_path), "RAY_AUTH_MODE": "disabled"},
        cwd=app_dir,
        timeout=300,
    )
    # The head's log of a per-client server that died is the reason; it goes
    # with the output into a failing assertion's message.
    for name in set(re.findall(r"ray_client_server_\d+\.err", res.stdout)):
        for log in (hosts.tmp_dir("head") / "ray").glob(f"session_*/logs/{name}"):
            res.stdout += f"\n--- the head's {log.name} ---\n{log.read_text()[-4000:]}"
    return res


def _jobs(sweep: Path) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    return jobs


def test_outputs_written_on_another_machine_come_home(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    # Jobs of a second: a job's start event reaches the actor before its end.
    res = _sweep_on_existing_cluster(
        fake_hosts, running_cluster, tmp_path, "app.py", "x=1,2,3", "raise_on=[3]", "seconds=1"
    )
    sweep = tmp_path / "sweep"
    assert res.returncode != 0, res.stdout  # job #2 raises
    # Ray Client has no streaming generators: start events came through an actor.
    assert re.search(r"#0 : x=1 raise_on=\[3\] seconds=1 started on 127\.0\.0\.[23]", res.stdout)
    # Each job's dir, with its files, is here, the failed job's too.
    for num in range(3):
        assert (sweep / str(num) / ".hydra" / "config.yaml").is_file(), res.stdout
        assert (sweep / str(num) / "app.log").is_file()
        assert (sweep / str(num) / f"done_{num}.json").is_file() == (num != 2)
    assert "Gathered the outputs written on node" in res.stdout
    # ...and no longer on the machines that ran them.
    for host in NODES:
        assert not fake_hosts.host_path(host, sweep).exists(), host
        assert list(fake_hosts.host_path(host, "/tmp").glob("hydra-ray-gather-*")) == [], host


def test_a_user_s_files_in_the_sweep_dir_on_the_nodes_stay_there(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"  # on the nodes, a dir of the user's already
    for host in NODES:
        theirs = fake_hosts.host_path(host, sweep)
        (theirs / "data").mkdir(parents=True)
        (theirs / "notes.txt").write_text(f"the user's notes on {host}")
        (theirs / "data" / "keep.bin").write_bytes(b"\0" * 1000)
    res = _sweep_on_existing_cluster(fake_hosts, running_cluster, tmp_path, "app.py", *SPREAD)
    assert res.returncode == 0, res.stdout
    assert {job["node"] for job in _jobs(sweep)} == {"127.0.0.2", "127.0.0.3"}, res.stdout
    for num in range(4):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.stdout
    assert not (sweep / "notes.txt").exists() and not (sweep / "data").exists()
    for host in NODES:
        theirs = fake_hosts.host_path(host, sweep)
        assert (theirs / "notes.txt").read_text() == f"the user's notes on {host}"
        assert (theirs / "data" / "keep.bin").stat().st_size == 1000
        assert sorted(p.name for p in theirs.iterdir()) == ["data", "notes.txt"], host


def test_a_node_whose_part_fails_keeps_its_files_and_the_others_come_home(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    (sweep / "1").write_text("")  # job #1's dir cannot be extracted here
    res = _sweep_on_existing_cluster(fake_hosts, running_cluster, tmp_path, "app.py", *SPREAD)
    assert res.returncode == 0, res.stdout  # every job succeeded
    node_of = {job["idx"]: job["node"] for job in _jobs(sweep)}
    failed = node_of[1]
    assert set(node_of.values()) == {"127.0.0.2", "127.0.0.3"}, res.stdout
    host_of = {"127.0.0.2": "head", "127.0.0.3": "worker"}
    stayed = sorted(str(sweep / str(num)) for num, node in node_of.items() if node == failed)
    assert (
        f"The outputs written on node {failed} did not come home (NotADirectoryError"
    ) in res.stdout
    assert f"they are still there, in {', '.join(stayed)}: copy them" in res.stdout
    for num, node in node_of.items():
        there = fake_hosts.host_path(host_of[node], sweep / str(num))
        if node == failed:
            assert (there / f"done_{num}.json").is_file(), num  # kept on its node
        else:
            assert (sweep / str(num) / f"done_{num}.json").is_file(), num  # came home
            assert not there.exists(), num
    assert list(fake_hosts.host_path(host_of[failed], "/tmp").glob("hydra-ray-gather-*")) == []


def test_the_files_of_a_job_s_recorded_attempt_win_over_its_failed_attempt_s(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    # The job that runs on the last node of ray.nodes() fails there and runs
    # again on the other node (see node_app.py): two attempts, two nodes.
    res = _sweep_on_existing_cluster(
        fake_hosts,
        running_cluster,
        tmp_path,
        "node_app.py",
        "x=1,2",
        "seconds=1",
        "fail_on_last_node=true",
        "hydra.launcher.retries=3",
    )
    # The failed attempt's actor holds its node's CPU a while yet: the next
    # test's jobs need both nodes.
    _wait_until_idle(fake_hosts, running_cluster, tmp_path)
    sweep = tmp_path / "sweep"
    assert res.returncode == 0, res.stdout
    retried = [job for job in _jobs(sweep) if job["attempts"] != 1]
    assert len(retried) == 1, res.stdout
    job = retried[0]
    home = sweep / str(job["idx"])
    assert (home / "checkpoint.txt").read_text() == f"final from {job['node']}", res.stdout
    # The failed attempt's other files, from the other node, are kept beside.
    partial = [p.name for p in home.glob("partial_from_*")]
    assert len(partial) == 1 and partial != [f"partial_from_{job['node']}"], partial


@contextlib.contextmanager
def _dashboard_port_alone(hosts: FakeHosts) -> Iterator[str]:
    """The head's dashboard as this process reaches it: through one forwarded
    port, as `kubectl port-forward` gives; this process is outside the hosts'
    network, where SSH, GCS, Ray Client and the dashboard are out of its reach:
    another network namespace, where the head's address is only this machine's
    loopback. (Not a probe of the head's ports from here: a Ray that other tests
    run on this machine meanwhile, beside this lane, answers on that loopback.)"""
    head = hosts.address("head")
    here = os.stat("/proc/self/ns/net").st_ino
    assert here != os.stat(f"/run/netns/{hosts.name}").st_ino, "in the hosts' network"

    def into_the_cluster() -> socket.socket:
        return call_in_netns(hosts.name, lambda: socket.create_connection((head, DASHBOARD)))

    with port_forward(0, connect=into_the_cluster) as port:
        yield f"http://127.0.0.1:{port}"


def _jobs_sweep(
    tmp_path: Path,
    dashboard: str,
    *overrides: str,
    env: dict[str, str] | None = None,
    sweep_dir: str = "sweep",
) -> tuple[subprocess.CompletedProcess[str], Path]:
    """tests/apps/app.py through ray_jobs, run from this process; its sweep dir."""
    app_dir = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app_dir)
    launcher = ["hydra/launcher=ray_jobs", f"hydra.launcher.address={dashboard}"]
    sweep = f"hydra.sweep.dir={sweep_dir}"
    res = subprocess.run(
        [sys.executable, "app.py", "--multirun", *overrides, *launcher, sweep],
        env={**launcher_env(tmp_path), "RAY_AUTH_MODE": "disabled", **(env or {})},
        cwd=app_dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    return res, app_dir / sweep_dir


def test_ray_jobs_runs_a_sweep_on_both_nodes_through_the_dashboard_port_alone(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    from ray.job_submission import JobSubmissionClient

    head, worker = (fake_hosts.address(h) for h in NODES)
    with _dashboard_port_alone(fake_hosts) as dashboard:
        res, sweep = _jobs_sweep(
            tmp_path,
            dashboard,
            "x=1,2,3,4",
            "seconds=2",
            "raise_on=[4]",
            # (Without SPREAD, Ray was seen to put all four on one node.)
            "hydra.launcher.ray.remote.scheduling_strategy=SPREAD",
            # A path of this machine (each fake host has its own /tmp): on the
            # cluster it lives in the Ray job's working dir, then comes here.
            sweep_dir=str(tmp_path / "exp" / "sweep"),
        )
        out = res.stdout
        assert res.returncode != 0, out  # job #3 raises
        jobs = _jobs(sweep)
        assert [j["status"] for j in jobs] == ["succeeded"] * 3 + ["failed"], out
        assert "job 3 was told to raise" in out
        assert {j["node"] for j in jobs} == {head, worker}, jobs
        # Every job's files are home, the worker's too, with their records.
        for num in range(4):
            assert (sweep / str(num) / ".hydra" / "config.yaml").is_file(), out
            assert (sweep / str(num) / f"done_{num}.json").is_file() == (num != 3)
            assert (sweep / ".hydra_ray" / f"job_{num}.pkl").is_file()
        # And nothing is left on the nodes: the worker's copies went with the gather,
        # the head's (and the pack) with the cleanup job.
        cleanup = re.search(r"\(Ray job (\S+-cleanup), node", out)
        assert cleanup, out
        client = JobSubmissionClient(dashboard)
        deadline = time.monotonic() + 120
        while str(client.get_job_status(cleanup.group(1))) not in ("SUCCEEDED", "FAILED"):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        assert str(client.get_job_status(cleanup.group(1))) == "SUCCEEDED"
    for host in NODES:
        assert not fake_hosts.host_path(host, tmp_path / "exp").exists(), host
        ray_tmp = fake_hosts.host_path(host, "/tmp/ray")
        left = list(ray_tmp.glob("session_*/runtime_resources/working_dir_files/*/sweep/*/*"))
        assert left == [], (host, left)
        assert list(ray_tmp.glob("session_*/logs/hydra-app-*.tar")) == [], host


def test_an_optuna_sweep_through_the_dashboard_port_alone_gets_every_return_value(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path, optuna_sweeper: Path
) -> None:
    """Hydra's Optuna sweeper on this machine only (the hosts have no Optuna):
    a batch of two trials, one on each node, their values reach Optuna."""
    path = os.pathsep.join(p for p in (str(optuna_sweeper), os.environ.get("PYTHONPATH")) if p)
    with _dashboard_port_alone(fake_hosts) as dashboard:
        res, sweep = _jobs_sweep(
            tmp_path,
            dashboard,
            "hydra/sweeper=optuna",
            "x=choice(1,2,3)",
            "seconds=2",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.direction=minimize",
            "hydra.launcher.ray.remote.scheduling_strategy=SPREAD",
            env={"PYTHONPATH": path},
        )
    assert res.returncode == 0, res.stdout
    jobs = _jobs(sweep)
    assert {j["node"] for j in jobs} == set(map(fake_hosts.address, NODES)), jobs
    xs = [int(next(o for o in j["overrides"] if o.startswith("x="))[2:]) for j in jobs]
    values = [j["return_value"] for j in jobs]
    assert len(values) == 2 and values == [10 * x for x in xs], res.stdout
    results = OmegaConf.load(sweep / "optimization_results.yaml")
    assert results.best_value == min(values) and results.best_params.x == min(xs)
    for num in range(2):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.stdout
