"""Proves the fake-host harness with Ray's cluster-launcher SDK alone (no plugin code)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ..cluster_harness.fake_hosts import (
    HEAD_IP,
    WORKER_IP,
    FakeHosts,
    FakeHostsError,
    HostSpec,
    launcher_env,
    ssh_control_dir,
    unique_cluster_name,
)

DRIVER = Path(__file__).with_name("sdk_driver.py")

# Runs on the head through `run_on_cluster`; its one task needs a resource only the worker has.
JOB = """\
import json, os, sys
import ray

marker_tmp, marker_home = sys.argv[1], sys.argv[2]
ray.init(address="auto", logging_level="ERROR")


@ray.remote(resources={"worker_marker": 1})
def write_markers():
    for path in (marker_tmp, os.path.expanduser(marker_home)):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write("written on the worker")
    return ray.util.get_node_ip_address()


task_ip = ray.get(write_markers.remote(), timeout=120)
os.makedirs("out", exist_ok=True)
with open("out/result.json", "w") as f:
    json.dump({"task_ip": task_ip, "driver_ip": ray.util.get_node_ip_address(),
               "alive_nodes": sum(n["Alive"] for n in ray.nodes())}, f)
print("JOB_OK", task_ip)
"""


def run_driver(
    hosts: FakeHosts,
    tmp_path: Path,
    config: dict[str, Any],
    steps: list[tuple[str, dict[str, Any]]],
    extra_env: dict[str, str] | None = None,
    timeout: float = 300,
) -> dict[str, Any]:
    """Run sdk_driver.py inside the hosts' netns; return {op: record} (last record per op)."""
    plan, result = tmp_path / "plan.json", tmp_path / "result.json"
    plan.write_text(json.dumps({"config": config, "steps": steps}))
    try:
        proc = hosts.run_in_netns(
            [sys.executable, str(DRIVER), str(plan), str(result)],
            env=launcher_env(tmp_path, extra_env),
            timeout=timeout,
        )
    finally:
        shutil.rmtree(ssh_control_dir(config["cluster_name"]), ignore_errors=True)
    (tmp_path / "driver.log").write_text(proc.stdout)
    records = json.loads(result.read_text()) if result.exists() else []
    timings = {r["op"]: r["seconds"] for r in records}
    print(f"driver exit {proc.returncode}, step timings: {timings}")
    failed = [r for r in records if not r["ok"]]
    assert proc.returncode == 0 and not failed, (
        f"driver failed: {failed or proc.returncode}\n--- driver output ---\n{proc.stdout[-5000:]}"
    )
    return {r["op"]: r for r in records}


def test_hosts_have_private_filesystems(fake_hosts: FakeHosts, tmp_path: Path) -> None:
    name = f"isolation-{tmp_path.name}"
    for path in (f"/tmp/{name}", f"/root/{name}"):
        res = fake_hosts.run_on_host("worker", ["sh", "-c", f"echo worker > {path}"])
        assert res.returncode == 0, res.stderr
        assert fake_hosts.host_path("worker", path).read_text() == "worker\n"
        assert not fake_hosts.host_path("head", path).exists()
        assert not Path(path).exists(), f"{path} leaked to the real host"
    # ~/.ray is a private mount on every host: no auth token inherited from the real /root
    for host in ("head", "worker"):
        assert fake_hosts.host_path(host, "~/.ray").stat().st_dev != Path("/root").stat().st_dev


def test_second_instance_and_leftover_netns(tmp_path: Path, fake_hosts: FakeHosts) -> None:
    name = f"fh-leftover-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", name], check=True)  # as if a crashed run left it
    with pytest.warns(UserWarning, match="leftover netns"), FakeHosts(name=name) as other:
        assert other.name != fake_hosts.name
        pid = other.init_pid("head")
        assert other.processes("head") == []
    assert not Path(f"/proc/{pid}").exists()
    assert not Path("/run/netns", name).exists()
    again = FakeHosts(tmp_path / "again")
    for _ in range(2):  # one instance, one base_dir, started twice: fresh machines each time
        with again:
            assert not again.host_path("worker", "/tmp/mark").exists()
            assert again.run_on_host("worker", ["touch", "/tmp/mark"]).returncode == 0


def test_failed_start_cleans_up(tmp_path: Path, fake_hosts: FakeHosts) -> None:
    # sshd cannot listen on an address that is not local in the netns: the host dies at start
    hosts = FakeHosts(hosts=(HostSpec("ok", "127.0.0.9"), HostSpec("bad", "10.255.255.1")))
    with pytest.raises(FakeHostsError, match="bad"):
        hosts.start()
    assert not Path("/run/netns", hosts.name).exists()
    assert [
        p for p in Path("/proc").glob("[0-9]*/cmdline") if hosts.name.encode() in _read(p)
    ] == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_local_provider_round_trip(fake_hosts: FakeHosts, tmp_path: Path) -> None:
    uid = tmp_path.name
    remote_dir = f"/tmp/{uid}/job"
    marker_tmp, marker_home = f"/tmp/{uid}/marker.txt", f"~/{uid}-marker.txt"
    (tmp_path / "up").mkdir()
    (tmp_path / "up" / "job.py").write_text(JOB)
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("harness"), worker_resources={"worker_marker": 1}
    )
    steps: list[tuple[str, dict[str, Any]]] = [
        ("create", {}),
        ("head_ip", {}),
        ("run", {"cmd": f"mkdir -p {remote_dir}"}),
        ("rsync_up", {"source": f"{tmp_path}/up/", "target": f"{remote_dir}/"}),
        ("run", {"cmd": f"cd {remote_dir} && python job.py {marker_tmp} {marker_home}"}),
        ("rsync_down", {"source": f"{remote_dir}/out/", "target": f"{tmp_path}/down/"}),
        ("teardown", {}),
    ]
    records = run_driver(fake_hosts, tmp_path, config, steps)

    assert records["head_ip"]["value"] == HEAD_IP
    assert f"JOB_OK {WORKER_IP}" in records["run"]["value"]
    result = json.loads((tmp_path / "down" / "result.json").read_text())
    assert result == {"task_ip": WORKER_IP, "driver_ip": HEAD_IP, "alive_nodes": 2}
    # rsync up landed on the head only
    assert fake_hosts.host_path("head", f"{remote_dir}/job.py").read_text() == JOB
    assert not fake_hosts.host_path("worker", f"{remote_dir}/job.py").exists()
    # the task's files exist on the worker only: not on the head, not on the real host
    for marker in (marker_tmp, marker_home):
        assert fake_hosts.host_path("worker", marker).read_text() == "written on the worker"
        assert not fake_hosts.host_path("head", marker).exists()
        assert not Path(marker.replace("~", "/root")).exists()
    # teardown ran `ray stop` on the head; the worker's raylet exits once the GCS is gone
    assert fake_hosts.wait_no_ray_processes("head", timeout=5) == []
    start = time.monotonic()
    assert fake_hosts.wait_no_ray_processes("worker", timeout=40) == []
    print(f"worker's Ray processes gone {time.monotonic() - start:.1f}s after teardown")
