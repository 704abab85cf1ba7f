"""The `ray_aws` launcher end to end, as a user runs it, against a fake EC2: moto
answers the AWS calls of Ray's cluster launcher, and one fake host answers ssh for
every instance moto hands out (see tests/cluster_harness/moto.py).

Each test runs `python app.py --multirun x=1,2 hydra/launcher=ray_aws ...` inside
the fake hosts' network namespace with moto's endpoint and fake credentials in
the environment. The launcher keeps its DEFAULT config; only what the fake
instance needs (`aws_overrides()`: internal IPs, root as ssh user, start commands
with the node's address) plus no conda env is set, as command-line overrides.
"""

import json
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import DictConfig, OmegaConf

from hydra_plugins.hydra_ray_launcher._config import AWSClusterConf

from ..cluster_harness.fake_hosts import (
    FakeHosts,
    call_in_netns,
    launcher_env,
    ssh_control_dir,
    unique_cluster_name,
)
from ..cluster_harness.moto import MotoServer, aws_overrides, running_instances
from .test_cluster_launcher import NetnsApp

REPO = Path(__file__).parents[2]
CLUSTER_KEY = "hydra.launcher.ray.cluster"
AWS_HOST = "aws"
# Cluster steps of Ray's cluster launcher: none of them may show when a launch is refused.
CLOUD_STEPS = ("Creating or updating cluster", "Waiting for SSH", "Launched a new head node")


# ---------------------------------------------------------------- overrides


def _render(value: Any) -> str:
    """A value in Hydra's override grammar (strings quoted)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        assert "${" not in value and "\\" not in value, value
        for quote in ('"', "'"):
            if quote not in value:
                return f"{quote}{value}{quote}"
        raise ValueError(f"cannot quote {value!r} for Hydra")
    if isinstance(value, list):
        return "[" + ",".join(_render(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_render(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no Hydra override for {value!r}")


def _overrides(prefix: str, schema: DictConfig, values: Mapping[str, Any]) -> list[str]:
    """`values` as command-line overrides below `prefix`: a key of the schema is
    overridden (dicts key by key), a key it lacks is added with `+`."""
    out = []
    for key, value in values.items():
        path = f"{prefix}.{key}"
        if key not in schema:
            out.append(f"+{path}={_render(value)}")
        elif isinstance(value, Mapping) and isinstance(schema[key], DictConfig):
            out += _overrides(path, schema[key], value)
        else:
            out.append(f"{path}={_render(value)}")
    return out


def fake_aws_overrides(cluster_name: str) -> list[str]:
    """What the default `ray_aws` config needs to run on the fake instance.

    The head gets 2 CPUs: both jobs of the sweep fit on it, so the autoscaler has
    no reason to launch a (spot) worker.
    """
    schema = OmegaConf.structured(AWSClusterConf)
    values = {"cluster_name": cluster_name, **aws_overrides(num_cpus=2)}
    # The fake hosts share this machine's Python: no conda env to create there.
    return [*_overrides(CLUSTER_KEY, schema, values), "hydra.launcher.env_setup.commands=[]"]


# ---------------------------------------------------------------- running the app


def run_app(
    hosts: FakeHosts,
    moto: MotoServer,
    tmp_path: Path,
    *overrides: str,
    timeout: float = 600,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """`python app.py --multirun x=1,2 hydra/launcher=ray_aws ...` in the hosts'
    netns with moto's env; returns the process (output merged) and its wall time."""
    app = tmp_path / "app"
    if not app.exists():
        shutil.copytree(REPO / "tests" / "apps", app)
    cmd = [
        sys.executable,
        "app.py",
        "--multirun",
        "x=1,2",
        "hydra/launcher=ray_aws",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
    ]
    start = time.monotonic()
    res = hosts.run_in_netns(cmd, env=launcher_env(tmp_path, moto.env), cwd=app, timeout=timeout)
    seconds = time.monotonic() - start
    (tmp_path / "app.out").write_text(res.stdout)
    print(f"app exited {res.returncode} after {seconds:.1f} s")
    return res, seconds


def _ec2(moto: MotoServer, fn: Any) -> Any:
    """Call `fn(ec2_client)` against moto, from inside its netns."""
    assert moto.netns is not None

    def call() -> Any:
        return fn(moto.client("ec2"))

    return call_in_netns(moto.netns, call)


def all_instances(moto: MotoServer) -> list[dict[str, Any]]:
    """Every EC2 instance moto knows, whatever its state (terminated ones too)."""
    reservations = _ec2(moto, lambda ec2: ec2.describe_instances()["Reservations"])
    return [inst for res in reservations for inst in res["Instances"]]


def _tags(instance: Mapping[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in instance.get("Tags", [])}


def _down_command(output: str) -> list[str]:
    """The `ray down -y FILE` the launcher printed for a cluster it keeps."""
    found = re.search(r"`?(ray down -y [^\n`]+)", output)
    assert found, output[-5000:]
    return shlex.split(found.group(1))


@pytest.fixture
def cluster_name(aws_hosts: FakeHosts) -> Iterator[str]:
    """A cluster name unique to the test; afterwards, its ssh sockets are removed
    and nothing the test started keeps running on the fake instance."""
    name = unique_cluster_name("aws-e2e")
    yield name
    shutil.rmtree(ssh_control_dir(name), ignore_errors=True)
    # Only after a failed test: the tests themselves assert that nothing is left.
    left = aws_hosts.processes(AWS_HOST)
    if left:
        print(f"killing leftovers on the fake instance: {left}")
        aws_hosts.kill_leftovers()
    for path in aws_hosts.host_path(AWS_HOST, "/tmp").glob("hydra-ray-*"):
        shutil.rmtree(path, ignore_errors=True)


def _assert_instance_host_clean(hosts: FakeHosts) -> None:
    assert hosts.wait_no_ray_processes(AWS_HOST, timeout=30) == []
    assert list(hosts.host_path(AWS_HOST, "/tmp").glob("hydra-ray-*")) == []


# ---------------------------------------------------------------- tests


def test_default_config_runs_sweep_and_deletes_cluster(
    aws_hosts: FakeHosts, moto_server: MotoServer, tmp_path: Path, cluster_name: str
) -> None:
    sweep = tmp_path / "sweep"
    res, seconds = run_app(aws_hosts, moto_server, tmp_path, *fake_aws_overrides(cluster_name))
    out = res.stdout
    assert res.returncode == 0, out[-8000:]

    for num, x in enumerate([1, 2]):
        job_dir = sweep / str(num)
        assert (job_dir / ".hydra" / "config.yaml").is_file()
        done = json.loads((job_dir / f"done_{num}.json").read_text())
        assert (done["num"], done["x"]) == (num, x)
        assert f"#{num} : x={x}" in out
    # S18: job list, job spec, cluster steps, syncing, teardown decision.
    for expected in (
        "Ray Launcher is launching 2 jobs",
        "Pickle for jobs:",
        f"Creating or updating cluster '{cluster_name}'",
        "Running the jobs from the cluster's head",
        "Synced down",
        f"Stopping cluster '{cluster_name}' now (stop_cluster=true",
        "Deleted the cluster",
    ):
        assert expected in out, f"{expected!r} not in output:\n{out[-8000:]}"
    assert "keeps running" not in out

    # The cluster Ray got: the defaults, env_setup's pinned pip installs as setup
    # commands (the unreleased plugin itself is shipped, not installed), no docker.
    cluster = yaml.safe_load((sweep / ".hydra" / "ray_cluster.yaml").read_text())
    assert cluster["setup_commands"] == [
        f"pip install omegaconf=={version('omegaconf')}",
        f"pip install hydra-core=={version('hydra-core')}",
        f"pip install 'ray[default]=={version('ray')}'",
        f"pip install cloudpickle=={version('cloudpickle')}",
    ]
    assert cluster["provider"]["region"] == "us-west-2"
    assert cluster["available_node_types"]["ray.head.default"]["node_config"]["InstanceType"] == (
        "m5.large"
    )
    assert "docker" not in cluster and "initial_workers" not in cluster
    assert f"pip install omegaconf=={version('omegaconf')}" in out  # run on the head
    assert re.search(r"#0 : x=1 succeeded in [\d.]+ s on 172\.31\.", out), out[-5000:]

    # The cluster existed on (fake) EC2, and is gone.
    assert running_instances(moto_server) == []
    instances = all_instances(moto_server)
    assert instances, "no instance was ever created"
    for inst in instances:
        assert inst["State"]["Name"] in ("shutting-down", "terminated"), inst["State"]
        assert _tags(inst).get("ray-cluster-name") == cluster_name
    _assert_instance_host_clean(aws_hosts)
    # The launcher's local scratch (job spec, returns, staged plugin) is gone too.
    assert list((tmp_path / "launcher-tmp").glob("hydra-ray-*")) == []
    print(f"default ray_aws sweep: {seconds:.1f} s for the app")


@pytest.mark.parametrize(
    ("override", "named_key"),
    [
        ("hydra.launcher.sync_up.source_dir=/does/not/exist", "hydra.launcher.sync_up.source_dir"),
        (f"{CLUSTER_KEY}.max_workers=-3", f"{CLUSTER_KEY}.max_workers"),
        (f"+{CLUSTER_KEY}.bogus_key=1", f"{CLUSTER_KEY}.bogus_key"),
        # Ray checks ray.remote's options on the head; ours are checked before any cluster.
        ("+hydra.launcher.ray.remote.num_gpu=1", "hydra.launcher.ray.remote is not valid"),
    ],
    ids=["missing-sync-up-source", "negative-max-workers", "unknown-cluster-key", "bad-remote"],
)
def test_bad_config_refused_before_any_cloud_call(
    aws_hosts: FakeHosts,
    moto_server: MotoServer,
    tmp_path: Path,
    cluster_name: str,
    override: str,
    named_key: str,
) -> None:
    res, seconds = run_app(
        aws_hosts, moto_server, tmp_path, *fake_aws_overrides(cluster_name), override, timeout=120
    )
    out = res.stdout
    assert res.returncode != 0, out[-5000:]
    # A compact error: the message naming the key, no traceback of the plugin.
    assert named_key in out and "Traceback" not in out, out[-5000:]
    for step in CLOUD_STEPS:
        assert step not in out, f"{step!r} in output:\n{out[-5000:]}"
    assert not list((tmp_path / "sweep").glob("*/done_*.json"))
    assert not (tmp_path / "sweep" / ".hydra" / "ray_cluster.yaml").exists()

    # Nothing at all was made on (fake) AWS: no instance, key pair or security group.
    assert all_instances(moto_server) == []
    assert _ec2(moto_server, lambda ec2: ec2.describe_key_pairs()["KeyPairs"]) == []
    groups = _ec2(moto_server, lambda ec2: ec2.describe_security_groups()["SecurityGroups"])
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    assert aws_hosts.ray_processes(AWS_HOST) == []
    print(f"refused in {seconds:.1f} s")


def test_stop_cluster_false_keeps_cluster_running(
    aws_hosts: FakeHosts, moto_server: MotoServer, tmp_path: Path, cluster_name: str
) -> None:
    sweep = tmp_path / "sweep"
    env = launcher_env(tmp_path, moto_server.env)
    # Where the launcher writes the cluster config (printed in its warning).
    down_cmd = ["ray", "down", "-y", str(sweep / ".hydra" / "ray_cluster.yaml")]
    res: subprocess.CompletedProcess[str] | None = None
    try:
        res, seconds = run_app(
            aws_hosts,
            moto_server,
            tmp_path,
            *fake_aws_overrides(cluster_name),
            "hydra.launcher.stop_cluster=false",
        )
        out = res.stdout
        assert res.returncode == 0, out[-8000:]
        for num in range(2):
            assert (sweep / str(num) / f"done_{num}.json").is_file()
            assert (sweep / str(num) / ".hydra" / "config.yaml").is_file()
        assert f"Cluster '{cluster_name}' keeps running (stop_cluster=false)" in out, out[-5000:]
        down_cmd = _down_command(out)
        assert down_cmd[:3] == ["ray", "down", "-y"] and len(down_cmd) == 4, down_cmd
        assert Path(down_cmd[3]).is_file(), down_cmd
        assert "Stopping cluster" not in out
        assert "Deleted the cluster" not in out

        # The head is still up on (fake) EC2 and still runs Ray.
        running = running_instances(moto_server)
        assert len(running) == 1, running
        assert _tags(running[0]).get("ray-cluster-name") == cluster_name
        assert aws_hosts.ray_processes(AWS_HOST) != []
        # Kept as asked: it does not tear itself down when idle.
        assert [p for p in aws_hosts.processes(AWS_HOST) if "autodown" in p.cmdline] == []
        print(f"stop_cluster=false sweep: {seconds:.1f} s for the app")
    finally:
        # The command the user was told to run, in the same netns and env.
        start = time.monotonic()
        ray_bin = str(Path(sys.prefix) / "bin" / "ray")
        down = None
        if Path(down_cmd[3]).is_file():
            down = aws_hosts.run_in_netns(
                [ray_bin, *down_cmd[1:]], env=env, cwd=tmp_path, timeout=300
            )
            (tmp_path / "ray_down.out").write_text(down.stdout)
            print(f"ray down exited {down.returncode} after {time.monotonic() - start:.1f} s")
    assert down is not None and down.returncode == 0, down.stdout[-5000:] if down else None
    assert running_instances(moto_server) == []
    _assert_instance_host_clean(aws_hosts)


def test_a_cluster_whose_launcher_is_gone_terminates_its_instances(
    aws_hosts: FakeHosts, moto_server: MotoServer, tmp_path: Path, cluster_name: str
) -> None:
    """kill -9 of the launching process mid-sweep (a closed laptop): the driver
    finishes the jobs on the head, and once the cluster has run nothing for
    hydra.launcher.autodown_minutes the head runs Ray's own teardown there,
    which reaches (fake) EC2 as the launcher's does: every instance terminated."""
    overrides = [
        o for o in fake_aws_overrides(cluster_name) if not o.startswith("hydra.launcher.env_setup")
    ]
    run = NetnsApp(
        aws_hosts,
        tmp_path,
        "x=1,2",
        "seconds=0.5",
        "slow_first=[2]",
        "slow_seconds=5",
        "hydra/launcher=ray_aws",
        "hydra.launcher.autodown_minutes=0.2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        env=moto_server.env,
    )
    try:
        run.wait_for("started on 172.31.", timeout=300)
        assert "then it tears itself down with them" in run.output, run.output[-5000:]
        assert len(running_instances(moto_server)) == 1
        run.kill_group()
        run.wait()
        deadline = time.monotonic() + 240
        while running_instances(moto_server):
            assert time.monotonic() < deadline, "the cluster did not tear itself down"
            time.sleep(2)
        for inst in all_instances(moto_server):
            assert inst["State"]["Name"] in ("shutting-down", "terminated"), inst["State"]
        (log,) = aws_hosts.host_path(AWS_HOST, "~/.hydra_ray/autodown").glob("*/log")
        # (Here the head outlives its instance: its teardown goes on to its end.)
        deadline = time.monotonic() + 90
        while "teardown ended with status" not in log.read_text():
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(1)
        assert "teardown ended with status 0" in log.read_text(), log.read_text()
        assert aws_hosts.wait_no_ray_processes(AWS_HOST, timeout=60) == []
    finally:
        run.kill()
