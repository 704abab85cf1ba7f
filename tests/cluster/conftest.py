"""Fixtures for tests that launch Ray clusters on fake hosts (see tests/cluster_harness).

* `fake_hosts` (session): head 127.0.0.2 + worker 127.0.0.3 for provider `local`.
* `aws_hosts` (session): one host answering for every moto instance (provider `aws`).
* `moto_server` (per test): a fresh moto inside `aws_hosts`' netns, Ray's IAM profile
  pre-created, the fake instance's shell pointed at it.

They skip only when the machine cannot run them: not root, or `ip`/`unshare`/`sshd`/`rsync`
missing (apt-get install iproute2 util-linux openssh-server rsync).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ..cluster_harness.fake_hosts import FakeHosts, missing_prerequisites
from ..cluster_harness.moto import MotoServer, aws_fake_hosts, new_aws_home, precreate_ray_iam
from ..cluster_harness.moto import moto_server as run_moto_server


def _skip_if_unsupported() -> None:
    problems = missing_prerequisites()
    if problems:
        pytest.skip("fake cluster hosts unavailable: " + "; ".join(problems))


@pytest.fixture(scope="session")
def fake_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    """Head (127.0.0.2) and worker (127.0.0.3) hosts; launchers must run via `run_in_netns`.

    The base dir is kept by pytest (last 3 runs), with each host's /tmp (Ray logs) in it.
    """
    _skip_if_unsupported()
    with FakeHosts(tmp_path_factory.mktemp("fake-hosts")) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def aws_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHosts]:
    """The fake EC2 instance(s): sshd on every address of moto's default VPC, in its own netns."""
    _skip_if_unsupported()
    with aws_fake_hosts(tmp_path_factory.mktemp("aws-hosts")) as hosts:
        yield hosts


@pytest.fixture
def moto_server(aws_hosts: FakeHosts, tmp_path: Path) -> Iterator[MotoServer]:
    """A fresh moto server in `aws_hosts`' netns; `.env` is for the launching process."""
    with run_moto_server(
        new_aws_home(aws_hosts), netns=aws_hosts.name, log_path=tmp_path / "moto_server.log"
    ) as server:
        aws_hosts.set_env(server.remote_env)
        precreate_ray_iam(server)
        yield server
