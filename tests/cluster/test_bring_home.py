"""What the launcher keeps when outputs do not all come home, decided in-process
with a stand-in for the cluster (the fake-hosts tests run the real thing)."""

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.hydra_ray_launcher._config import ClusterSyncDownConf
from hydra_ray.core.errors import ClusterCommandError, OutputsNotHomeError
from hydra_ray.core.jobs import JobOutcome
from hydra_ray.core.records import read_record, write_record, write_summary
from hydra_ray.core.settings import SyncDown
from hydra_ray.infra.autoscaler import Cluster, RemoteTmp
from hydra_ray.launch.cluster import _bring_home_from_head

from ..conftest import sweep_key_of

HEAD_TMP = "/tmp/hydra-ray-abc"
# The sweep dirs below are absolute (paths of the launching machine): on the head
# the sweep lives in the launch's temp dir.
HEAD_SWEEP = f"{HEAD_TMP}/sweep"
# The cluster launchers' sync_down as a user who sets none of its keys has it.
_SYNC_DOWN = SyncDown.of(OmegaConf.structured(ClusterSyncDownConf))


class StandInCluster(Cluster):
    """Answers the launcher's commands as a head would; `reports` are the gather
    reports it finds, one per read; rsync down of the `failing` source fails."""

    def __init__(self, tmp_path: Path, reports: list[dict[str, object] | None], failing: str = ""):
        config_file = tmp_path / "sweep" / ".hydra" / "ray_cluster.yaml"
        super().__init__(config={"cluster_name": "c1"}, run_env="auto", config_file=config_file)
        self.reports = reports
        self.failing = failing
        self.commands: list[str] = []
        self.downloads: list[str] = []

    def run(self, cmd: str, *, with_output: bool = False, run_env: str | None = None) -> str:
        self.commands.append(cmd)
        if "gather_report.json" in cmd:
            report = self.reports.pop(0)
            return "" if report is None else f"HYDRA_RAY_GATHER_REPORT={json.dumps(report)}\n"
        if "returns.pkl" in cmd:
            return "HYDRA_RAY_FOUND\n"
        return ""

    def rsync_down(self, source: str, target: str) -> None:
        if source == self.failing:
            raise ClusterCommandError(f"rsync {source} -> {target} failed: SSH command failed.")
        self.downloads.append(source)


def _bring(
    cluster: StandInCluster,
    tmp_path: Path,
    remote: RemoteTmp | None = None,
    jobs: Sequence[int] = (),
) -> RemoteTmp:
    """What the launcher brings home of the sweep dir tmp_path/sweep."""
    remote = remote or RemoteTmp(HEAD_TMP)
    sweep = tmp_path / "sweep"
    _bring_home_from_head(
        cluster, remote, _SYNC_DOWN, sweep, tmp_path, sweep_key_of(sweep), jobs=jobs
    )
    return remote


def test_a_complete_gather_report_lets_everything_come_home_and_the_cluster_go(
    tmp_path: Path,
) -> None:
    cluster = StandInCluster(tmp_path, [{"complete": True, "left": []}])
    remote = _bring(cluster, tmp_path)
    assert cluster.downloads == [
        f"{HEAD_SWEEP}/.hydra_ray/",
        f"{HEAD_TMP}/returns.pkl",
        f"{HEAD_SWEEP}/",
    ]
    assert cluster.leftovers is None and not remote.kept
    assert not any("hydra_ray.driver.head gather" in c for c in cluster.commands)


def test_outputs_left_on_a_node_keep_the_cluster_with_the_commands_that_gather_them(
    tmp_path: Path,
) -> None:
    left = {"complete": False, "left": [{"node": "10.0.0.3", "paths": ["1"]}]}
    cluster = StandInCluster(tmp_path, [None, left])
    remote = RemoteTmp(HEAD_TMP)
    with pytest.raises(OutputsNotHomeError, match=r"still on other nodes.*10\.0\.0\.3 \(1\)"):
        _bring(cluster, tmp_path, remote)
    # No report (the driver did not finish): `gather` ran, and its report was read.
    assert sum("hydra_ray.driver.head gather" in c for c in cluster.commands) == 1
    assert remote.kept and cluster.leftovers is not None
    # What is on the head still came home; the commands gather the rest, then bring it.
    assert len(cluster.downloads) == 3
    first, second = cluster.leftovers.commands
    assert first.startswith("ray exec ") and "hydra_ray.driver.head gather" in first
    assert second.startswith("ray rsync-down ")


def test_the_summary_of_a_job_whose_outputs_stayed_on_a_node_says_where_they_are(
    tmp_path: Path,
) -> None:
    """Job #1 succeeded on a node that did not give its files (gone, its disk
    out of reach): its record, and so sweep_summary.json, says where they are."""
    sweep = tmp_path / "sweep"
    for idx in (0, 1):
        ret = JobReturn(overrides=[f"x={idx}"], status=JobStatus.COMPLETED)
        ret.return_value = idx
        write_record(
            sweep,
            JobOutcome(idx, ret, 0.0, 1.0, "10.0.0.3", job_dir=f"{HEAD_SWEEP}/{idx}"),
            sweep_key_of(sweep),
        )
    left = {"complete": False, "left": [{"node": "10.0.0.3", "paths": [f"{HEAD_SWEEP}/1"]}]}
    cluster = StandInCluster(tmp_path, [left, left])
    remote = RemoteTmp(HEAD_TMP)
    with pytest.raises(OutputsNotHomeError):
        _bring(cluster, tmp_path, remote, jobs=[0, 1])
    outcomes = [read_record(sweep, idx, sweep_key_of(sweep)) for idx in (0, 1)]
    summary = json.loads(write_summary(sweep, [], filter(None, outcomes)).read_text())
    assert [j["outputs_left"] for j in summary["jobs"]] == [
        None,
        f"on node 10.0.0.3: {HEAD_SWEEP}/1",
    ]
    assert [j["status"] for j in summary["jobs"]] == ["succeeded", "succeeded"]


def test_a_failed_transfer_of_the_outputs_keeps_them_after_the_records_came_home(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "sweep"
    cluster = StandInCluster(tmp_path, [{"complete": True, "left": []}], failing=f"{HEAD_SWEEP}/")
    remote = RemoteTmp(HEAD_TMP)
    with pytest.raises(OutputsNotHomeError, match="the outputs did not come home"):
        _bring(cluster, tmp_path, remote)
    assert cluster.downloads == [f"{HEAD_SWEEP}/.hydra_ray/", f"{HEAD_TMP}/returns.pkl"]
    assert remote.kept and cluster.leftovers is not None
    assert cluster.leftovers.commands == [
        f"ray rsync-down {cluster.config_file} {HEAD_SWEEP}/ {sweep}/"
    ]
