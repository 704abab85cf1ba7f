"""A moto server standing in for AWS (EC2, IAM), and fake hosts that answer as its instances.

Ray's AWS provider creates an IAM role, a key pair, a security group and instances through
boto3, then ssh-es to each instance. Against moto the instances exist only on paper, so:

* `aws_fake_hosts()` is a `FakeHosts` with one host whose sshd listens on 0.0.0.0 in a netns
  where moto's default-VPC range 172.31.0.0/16 is local: any private IP moto hands out reaches
  it. It accepts Ray's generated key (`~/.ssh/<key>.pem` below the launcher's HOME, which lives
  in the hosts' `key_dir`). All instances land on this one host, so several instances share it.
* `moto_server()` runs `moto_server` inside that netns (the launcher and the head's autoscaler
  run there and must reach it on 127.0.0.1).
* `aws_overrides()` is what a cluster config needs to get through: `use_internal_ips`, root as
  ssh user, start commands with each node's address and without `ray stop` on workers.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fake_hosts import FakeHosts, HostSpec, call_in_netns, free_port

DEFAULT_REGION = "us-west-2"
# moto's default VPC is 172.31.0.0/16; on the netns loopback the whole prefix becomes local
MOTO_VPC_LOCAL_CIDR = "172.31.0.1/16"
AWS_HOST = "aws"
# Ray's default IAM role / instance profile names (ray.autoscaler._private.aws.config)
RAY_IAM_NAME = "ray-autoscaler-v1"


@dataclass(frozen=True)
class MotoServer:
    endpoint: str
    region: str
    home: Path
    netns: str | None
    pid: int
    # for the launching process: endpoint, fake credentials, HOME (Ray writes ~/.ssh/<key>.pem)
    env: dict[str, str] = field(default_factory=dict)
    # for the fake instances (FakeHosts.set_env): the head's autoscaler calls EC2 too
    remote_env: dict[str, str] = field(default_factory=dict)

    def client(self, service: str) -> Any:
        """A boto3 client of `service` against this server (call it inside its netns, if any)."""
        return _client(service, self.endpoint, self.region)


def _boto3() -> Any:
    # boto3 ships no type hints: a dynamic import keeps `mypy --strict` happy without ignores
    return importlib.import_module("boto3")


def _aws_env(endpoint: str, region: str) -> dict[str, str]:
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": region,
        "AWS_REGION": region,
        # an HTTP(S)_PROXY from CI must not swallow requests to 127.0.0.1
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def aws_fake_hosts(base_dir: Path | None = None, **kwargs: Any) -> FakeHosts:
    """FakeHosts whose single host answers ssh on every address of moto's default VPC.

    Give `moto_server()` a HOME below its `key_dir` (see `new_aws_home()`), so that the key
    Ray generates in ~/.ssh is accepted.
    """
    return FakeHosts(
        base_dir,
        hosts=(HostSpec(AWS_HOST, "0.0.0.0"),),
        local_cidrs=(MOTO_VPC_LOCAL_CIDR,),
        accept_generated_keys=True,
        **kwargs,
    )


def new_aws_home(hosts: FakeHosts) -> Path:
    """A fresh HOME for a launching process, below the hosts' key_dir."""
    return Path(tempfile.mkdtemp(prefix="home-", dir=hosts.key_dir))


@contextlib.contextmanager
def moto_server(
    home: Path,
    *,
    netns: str | None = None,
    region: str = DEFAULT_REGION,
    log_path: Path | None = None,
    start_timeout: float = 60.0,
    node_start_wait_s: int = 60,
) -> Iterator[MotoServer]:
    """Run `moto_server` on 127.0.0.1:<free port> (inside `netns` if given) until exit.

    home: scratch HOME for the launching process (created; for `aws_fake_hosts`, a directory
        below its key_dir).
    node_start_wait_s: AUTOSCALER_NODE_START_WAIT_S for the launcher (Ray waits 900 s for ssh
        by default, far too long for a test that went wrong).
    """
    home.mkdir(parents=True, exist_ok=True)
    (home / ".ssh").mkdir(mode=0o700, exist_ok=True)
    port = free_port(netns)
    endpoint = f"http://127.0.0.1:{port}"
    server_env = dict(os.environ)
    server_env.update(_aws_env(endpoint, region))
    # Ray attaches AWS managed policies (AmazonEC2FullAccess, ...) to the role it creates
    server_env["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    cmd = [str(Path(sys.prefix) / "bin" / "moto_server"), "-H", "127.0.0.1", "-p", str(port)]
    if netns is not None:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    log_file = log_path or home / "moto_server.log"
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            env=server_env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        _wait_moto(proc, endpoint, netns, log_file, start_timeout)
        env = _aws_env(endpoint, region)
        env.update(HOME=str(home), AUTOSCALER_NODE_START_WAIT_S=str(node_start_wait_s))
        yield MotoServer(
            endpoint=endpoint,
            region=region,
            home=home,
            netns=netns,
            pid=proc.pid,
            env=env,
            remote_env=_aws_env(endpoint, region),
        )
    finally:
        # `ip netns exec` execs moto_server: proc.pid is the server itself, a single process
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def _wait_moto(
    proc: subprocess.Popen[bytes], endpoint: str, netns: str | None, log: Path, timeout: float
) -> None:
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def answers() -> bool:
        try:
            with opener.open(f"{endpoint}/moto-api/", timeout=2) as resp:
                return int(resp.status) < 500
        except urllib.error.HTTPError as exc:
            return exc.code < 500
        except OSError:
            return False

    deadline = time.monotonic() + timeout
    while not (call_in_netns(netns, answers) if netns else answers()):
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"moto_server did not come up on {endpoint}: {text}")
        time.sleep(0.1)


def _client(service: str, endpoint: str, region: str) -> Any:
    return _boto3().client(
        service,
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def running_instances(
    server: MotoServer | str, *, netns: str | None = None, region: str = DEFAULT_REGION
) -> list[dict[str, Any]]:
    """EC2 instances moto has in state pending or running.

    server: a MotoServer (its netns and region are used) or an endpoint URL (then give
        `netns` if the server only listens inside one).
    """
    if isinstance(server, MotoServer):
        endpoint, netns, region = server.endpoint, server.netns, server.region
    else:
        endpoint = server

    def query() -> list[dict[str, Any]]:
        ec2 = _client("ec2", endpoint, region)
        states = {"Name": "instance-state-name", "Values": ["pending", "running"]}
        reservations = ec2.describe_instances(Filters=[states])["Reservations"]
        return [inst for res in reservations for inst in res["Instances"]]

    # the server may only be reachable inside its netns
    return call_in_netns(netns, query) if netns else query()


def precreate_ray_iam(server: MotoServer) -> None:
    """Create Ray's default instance profile + role in moto.

    When Ray creates them itself it sleeps 2 x 15 s "for propagation"; a test that does not
    exercise IAM creation saves 30 s this way.
    """

    def create() -> None:
        iam = _client("iam", server.endpoint, server.region)
        assume = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "ec2.amazonaws.com"},
                    "Action": "sts:AssumeRole",
                }
            ],
        }
        iam.create_role(RoleName=RAY_IAM_NAME, AssumeRolePolicyDocument=json.dumps(assume))
        iam.create_instance_profile(InstanceProfileName=RAY_IAM_NAME)
        iam.add_role_to_instance_profile(InstanceProfileName=RAY_IAM_NAME, RoleName=RAY_IAM_NAME)

    if server.netns:
        call_in_netns(server.netns, create)
    else:
        create()


def aws_overrides(
    *,
    num_cpus: int = 1,
    auth_mode: str | None = "disabled",
    head_resources: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """What to merge into an AWS cluster config so it runs against `aws_fake_hosts()`.

    * use_internal_ips: ssh to the instance's private IP (local in the netns), not its
      made-up public one;
    * ssh_user root: the fake instance only knows root;
    * start commands that pass each node's own address (taken from the ssh session) as
      --node-ip-address, and no `ray stop` for workers (they share the head's host).
    """
    env = f"export RAY_AUTH_MODE={auth_mode}; " if auth_mode else ""
    node_ip = "export FAKEHOST_IP=$(echo $SSH_CONNECTION | cut -d' ' -f3); "
    resources = ""
    if head_resources:
        body = ", ".join(f'"{k}": {v}' for k, v in head_resources.items())
        resources = " --resources='{" + body + "}'"
    return {
        "provider": {"use_internal_ips": True},
        "auth": {"ssh_user": "root"},
        "head_start_ray_commands": [
            "ray stop",
            f"{node_ip}{env}ray start --head --port=6379 --node-ip-address=$FAKEHOST_IP"
            f" --num-cpus={num_cpus} --autoscaling-config=~/ray_bootstrap_config.yaml{resources}",
        ],
        "worker_start_ray_commands": [
            f"{node_ip}{env}ray start --address=$RAY_HEAD_IP:6379 --node-ip-address=$FAKEHOST_IP"
            f" --num-cpus={num_cpus}",
        ],
    }


def deep_merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Copy of `base` with `overrides` merged in (dicts recursively, everything else replaced)."""
    merged = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def aws_cluster_config(
    cluster_name: str,
    *,
    key_name: str | None = None,
    region: str = DEFAULT_REGION,
    max_workers: int = 0,
) -> dict[str, Any]:
    """A small provider-`aws` cluster config (head only by default), `aws_overrides()` applied.

    setup commands are emptied: Ray's defaults `pip install` on the head.
    """
    config: dict[str, Any] = {
        "cluster_name": cluster_name,
        "max_workers": max_workers,
        "idle_timeout_minutes": 5,
        "provider": {
            "type": "aws",
            "region": region,
            "availability_zone": f"{region}a",
            # terminate (not stop) instances on teardown
            "cache_stopped_nodes": False,
            "key_pair": {"key_name": key_name or cluster_name},
        },
        "available_node_types": {
            "ray.head.default": {
                "resources": {},
                "node_config": {"InstanceType": "m5.large", "ImageId": "ami-0a2363a9cff180a64"},
            },
            "ray.worker.default": {
                "min_workers": 0,
                "max_workers": max_workers,
                "resources": {},
                "node_config": {"InstanceType": "m5.large", "ImageId": "ami-0a2363a9cff180a64"},
            },
        },
        "head_node_type": "ray.head.default",
        "setup_commands": [],
        "head_setup_commands": [],
        "worker_setup_commands": [],
    }
    return deep_merge(config, aws_overrides())
