"""The head-driver protocol: what the launching machine and the driver on a
cluster's head (`hydra_ray.driver.head`) share. The job spec the launcher
builds and sends, the plugin staged beside it, the files of the driver's
working dir, the commands that run the driver, and the pack of the Jobs API.

Both sides import this module; it imports only the data types (no Ray).
"""

import importlib.util
import shlex
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import DictConfig

from hydra_ray import FACE
from hydra_ray.core.jobs import Job, JobOutcome, Policy, SweepState

# The driver, run as `python -m DRIVER_MODULE` in its working dir on the head.
DRIVER_MODULE = "hydra_ray.driver.head"
# The files of the driver's working dir (a temp dir of the launch on the head),
# shared with the launcher: this plugin's source (both of its packages, and
# rich), the job spec it sends, the returns it brings home.
PLUGIN_DIR = "plugin"
JOB_SPEC = "job_spec.pkl"
RETURNS = "returns.pkl"
# The packages staged in PLUGIN_DIR that the jobs import on every node.
PACKAGES = ("hydra_plugins", "hydra_ray")
# Written in its working dir by the driver and by `gather` once they have tried to
# bring every node's outputs onto the head: {"complete": bool, "left": [{"node":
# IP, "node_id": ID, "paths": [...], "error": why}]}. The launcher tears the
# cluster down only after a complete one (a missing file means the gather did not
# end: outputs may still be on nodes).
GATHER_REPORT = "gather_report.json"

# The Jobs API launcher's files: in the Ray job's working dir, what to pack
# ({"name": file name in the log dir, "sweep_dir", "include", "exclude", "storage"});
# in the job's log, the line that says where the pack is (then a JSON object: size,
# sha256, node_ip, cluster_sweep, and node_id, file, pack_path in the log dir, or
# storage and key).
BUNDLE_PLAN = "bundle.json"
BUNDLE_MARK = "HYDRA_RAY_BUNDLE "
# In the pack: the returns and the gather report (if written), the records, the
# outputs (the sweep dir, filtered by sync_down, without the records).
BUNDLE_RECORDS = "records"
BUNDLE_OUTPUTS = "outputs"


@dataclass(frozen=True)
class JobSpec:
    """What the launching machine sends to the head: serialised as job_spec.pkl."""

    state: SweepState
    jobs: Sequence[Job]
    init: dict[str, Any]
    # The sweep output dir as the jobs will resolve it (relative to the head's cwd).
    sweep_dir: str
    # The app's config files are not on the cluster: the jobs compose their
    # configs from the state's snapshot of them, or, where it cannot stand in,
    # these were composed on the launching machine.
    configs: Mapping[int, DictConfig] | None
    # Dir synced up with the user's code, relative to the head driver's working
    # dir or absolute: on every node's sys.path for the jobs.
    code_dir: str | None
    policy: Policy
    # Draw the live display (the user's terminal is one), this wide.
    live: bool
    width: int | None
    # Jobs of the batch taken from an earlier run (resume): for the progress counts.
    already_done: int


def stage_plugin(staged: Path, *, display: bool = True) -> None:
    """Copy into `staged` (the PLUGIN_DIR that goes to the cluster) this plugin's
    own source, its Hydra face and its implementation, so that the head's driver
    and the jobs on every node run the very code of the launching machine,
    whatever version is installed there; and rich (pure Python), which draws the
    driver's display (`display`): the cluster's packages need not include it."""
    import rich

    # Where the face is, without importing it (the implementation never does).
    face = importlib.util.find_spec(FACE)
    assert face is not None and face.submodule_search_locations, f"{FACE} is not installed"
    for source, target in (
        (Path(face.submodule_search_locations[0]), staged / "hydra_plugins" / "hydra_ray_launcher"),
        (Path(__file__).parent.parent, staged / "hydra_ray"),
        *([(Path(rich.__file__).parent, staged / "rich")] if display else []),
    ):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))


def driver_command(remote_tmp: str, code_dir: str | None) -> str:
    """The shell command, run on the head, that runs the sweep (`main`)."""
    tmp = shlex.quote(remote_tmp)
    return _command(remote_tmp, f"{tmp}/{JOB_SPEC} {tmp}/{RETURNS}", code_dir)


def gather_command(remote_tmp: str, sweep_dir: Path) -> str:
    """The shell command, run on the head, that gathers after a failure."""
    return _command(remote_tmp, f"gather {shlex.quote(str(sweep_dir))}")


def _command(remote_tmp: str, args: str, code_dir: str | None = None) -> str:
    """`python -m` the driver with ARGS in the head's temp dir, with the shipped
    plugin (and the synced code) on its path."""
    tmp = shlex.quote(remote_tmp)
    pythonpath = f"{tmp}/{PLUGIN_DIR}:" + (f"{shlex.quote(code_dir)}:" if code_dir else "")
    return (
        f"cd {tmp} && PYTHONPATH={pythonpath}$PYTHONPATH RAY_DEDUP_LOGS=0 "
        f"python -m {DRIVER_MODULE} {args}"
    )


def load_outcomes(path: str) -> list[JobOutcome]:
    """The job outcomes the driver wrote to `path` (RETURNS)."""
    with open(path, "rb") as f:
        outcomes = cloudpickle.load(f)
    assert isinstance(outcomes, list)
    return outcomes
