"""Test harness: fake remote hosts (and a fake AWS) for Ray cluster-launcher tests.

See fake_hosts.py and moto.py; pytest fixtures live in tests/cluster/conftest.py.
"""

from .fake_hosts import (
    HEAD_IP,
    WORKER_IP,
    FakeHosts,
    FakeHostsError,
    HostProcess,
    HostSpec,
    call_in_netns,
    launcher_env,
    missing_prerequisites,
    ssh_control_dir,
    thread_pool_teardown_env,
    unique_cluster_name,
)
from .moto import (
    MotoServer,
    aws_cluster_config,
    aws_fake_hosts,
    aws_overrides,
    deep_merge,
    moto_server,
    new_aws_home,
    precreate_ray_iam,
    running_instances,
)

__all__ = [
    "HEAD_IP",
    "WORKER_IP",
    "FakeHosts",
    "FakeHostsError",
    "HostProcess",
    "HostSpec",
    "MotoServer",
    "aws_cluster_config",
    "aws_fake_hosts",
    "aws_overrides",
    "call_in_netns",
    "deep_merge",
    "launcher_env",
    "missing_prerequisites",
    "moto_server",
    "new_aws_home",
    "precreate_ray_iam",
    "running_instances",
    "ssh_control_dir",
    "thread_pool_teardown_env",
    "unique_cluster_name",
]
