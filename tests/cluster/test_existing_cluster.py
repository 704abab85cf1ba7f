"""The `ray` launcher on an existing cluster of other machines (fake hosts, each
with its own filesystem), through Ray Client (`ray://`): the jobs' configs are
composed here, the jobs run there, and every job's outputs come home from the
node that ran it."""

import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from ..cluster_harness.fake_hosts import FakeHosts, launcher_env, unique_cluster_name

REPO = Path(__file__).parents[2]


@pytest.fixture
def running_cluster(fake_hosts: FakeHosts, tmp_path: Path) -> Iterator[str]:
    """A cluster started with `ray up` (head without CPUs: the jobs run on the
    worker); yields the head's address; `ray down` after the test."""
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("ext"),
        num_cpus=2,
        head_args=["--num-cpus=0", "--include-dashboard=false"],
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
    """Until Ray Client answers and both nodes are in: right after `ray up`, the
    client server may fail a first connection (seen once under load: its
    per-client server died at start, "psutil.ZombieProcess")."""
    probe = (
        "import ray, sys; ray.init(sys.argv[1]); "
        "print('ALIVE', sum(n['Alive'] for n in ray.nodes())); ray.shutdown()"
    )
    deadline = time.monotonic() + 180
    while True:
        res = hosts.run_in_netns(
            [sys.executable, "-c", probe, f"ray://{address}"], env=env, timeout=120
        )
        if res.returncode == 0 and "ALIVE 2" in res.stdout:
            return
        assert time.monotonic() < deadline, res.stdout
        time.sleep(2)


def test_outputs_written_on_another_machine_come_home(
    fake_hosts: FakeHosts, running_cluster: str, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app)
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, "app.py", "--multirun", "x=1,2,3", "raise_on=[3]"]
    cmd += ["hydra/launcher=ray", f"hydra.launcher.ray.init.address=ray://{running_cluster}"]
    res = fake_hosts.run_in_netns(
        [*cmd, f"hydra.sweep.dir={sweep}"],
        env={**launcher_env(tmp_path), "RAY_AUTH_MODE": "disabled"},
        cwd=app,
        timeout=300,
    )
    assert res.returncode != 0, res.stdout  # job #2 raises
    assert "on 127.0.0.3" in res.stdout, res.stdout  # the jobs ran on the worker machine
    # Ray Client has no streaming generators: start events came through an actor.
    assert "#0 : x=1 raise_on=[3] started on 127.0.0.3" in res.stdout
    # Each job's dir, with its files, is here, the failed job's too.
    for num in range(3):
        assert (sweep / str(num) / ".hydra" / "config.yaml").is_file(), res.stdout
        assert (sweep / str(num) / "app.log").is_file()
        assert (sweep / str(num) / f"done_{num}.json").is_file() == (num != 2)
    assert "Gathered the outputs written on node" in res.stdout
    # ...and no longer on the worker.
    assert not fake_hosts.host_path("worker", sweep).exists()
