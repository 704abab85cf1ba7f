"""The cluster's handle in-process, with Ray's SDK stood in for (no cluster): the
commands it issues with docker, its named error, and the teardown callback that
travels with Hydra's context."""

import pickle
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest
from hydra.experimental.callback import Callback

from hydra_plugins.hydra_ray_launcher.ray_aws_launcher import RayAWSLauncher, _CloseAtMultirunEnd
from hydra_ray.core.errors import ClusterCommandError
from hydra_ray.infra.autoscaler import Cluster

DOCKER = {"image": "rayproject/ray:latest", "container_name": "ray_container"}


class FakeSDK:
    """Records what the Cluster asks of `ray.autoscaler.sdk`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from ray.autoscaler import sdk

        self.calls: list[tuple[str, dict[str, Any]]] = []
        monkeypatch.setattr(sdk, "rsync", self._call("rsync"))
        monkeypatch.setattr(sdk, "run_on_cluster", self._call("run_on_cluster"))

    def _call(self, name: str) -> Any:
        def call(config: dict[str, Any], **kwargs: Any) -> bytes:
            self.calls.append((name, kwargs))
            return b""

        return call


def _cluster(**config: Any) -> Cluster:
    return Cluster(
        config={"cluster_name": "c1", **config},
        run_env="auto",
        config_file=Path("/sweep/.hydra/ray_cluster.yaml"),
    )


def test_with_docker_the_copy_ray_stages_on_the_head_host_is_removed_after_each_transfer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ray's docker runner stages every rsync under /tmp/ray_tmp_mount/<cluster>/ on
    the head host (readable by all) and leaves it there: the job spec must not stay."""
    sdk = FakeSDK(monkeypatch)
    cluster = _cluster(docker=DOCKER)
    cluster.rsync_up("/local/job_spec.pkl", "/tmp/hydra-ray-x/job_spec.pkl")
    cluster.rsync_down("/tmp/hydra-ray-x/sweep/", "/home/me/sweep/")
    assert sdk.calls == [
        ("rsync", {"source": "/local/job_spec.pkl", "target": "/tmp/hydra-ray-x/job_spec.pkl",
                   "down": False}),
        ("run_on_cluster", {"cmd": "rm -rf /tmp/ray_tmp_mount/c1/tmp/hydra-ray-x/job_spec.pkl",
                            "run_env": "host", "with_output": False}),
        ("rsync", {"source": "/tmp/hydra-ray-x/sweep/", "target": "/home/me/sweep/",
                   "down": True}),
        ("run_on_cluster", {"cmd": "rm -rf /tmp/ray_tmp_mount/c1/tmp/hydra-ray-x/sweep",
                            "run_env": "host", "with_output": False}),
    ]  # fmt: skip


def test_without_docker_a_transfer_is_one_rsync(monkeypatch: pytest.MonkeyPatch) -> None:
    sdk = FakeSDK(monkeypatch)
    _cluster().rsync_up("/local/job_spec.pkl", "/tmp/hydra-ray-x/job_spec.pkl")
    assert [name for name, _ in sdk.calls] == ["rsync"]


@pytest.mark.parametrize(
    "raised",
    [
        click.ClickException("SSH command failed."),
        subprocess.CalledProcessError(23, ["rsync"]),
        RuntimeError("Head node of cluster (c1) not found!"),
    ],
)
def test_a_failed_command_on_the_cluster_is_one_named_error(
    monkeypatch: pytest.MonkeyPatch, raised: Exception
) -> None:
    from ray.autoscaler import sdk

    def fail(config: dict[str, Any], **kwargs: Any) -> None:
        raise raised

    monkeypatch.setattr(sdk, "rsync", fail)
    with pytest.raises(ClusterCommandError, match=r"rsync /a -> /b \(to the head\) failed") as info:
        _cluster().rsync_up("/a", "/b")
    assert info.value.__cause__ is raised


def test_an_interrupt_during_a_command_is_not_turned_into_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ray.autoscaler import sdk

    def interrupted(config: dict[str, Any], **kwargs: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(sdk, "rsync", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _cluster().rsync_down("/a", "/b")


def test_the_teardown_callback_travels_with_hydras_context_as_a_no_op() -> None:
    """Hydra's context (and its callbacks) is pickled into the job spec: the jobs must
    not get the launcher, nor tear anything down."""
    callback = _CloseAtMultirunEnd(RayAWSLauncher())
    shipped = pickle.loads(pickle.dumps(callback))
    assert type(shipped) is Callback
