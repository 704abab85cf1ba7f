"""The driver that runs on a cluster's head: connects to the cluster's Ray, runs
the sweep with the same engine as the local launcher, gathers every job's
outputs from the node that wrote them onto the head, and writes the job returns.

    python -m hydra_plugins.hydra_ray_launcher._head_driver JOB_SPEC RETURNS

When that driver did not finish (Ctrl-C, killed, failed), the launcher runs

    python -m hydra_plugins.hydra_ray_launcher._head_driver gather SWEEP_DIR

which stops it if it still runs, then gathers what the finished jobs wrote on
other nodes, so that sync_down brings it home before the cluster goes.
"""

import dataclasses
import json
import logging
import os
import shlex
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import DictConfig

from ._engine import Job, Policy
from ._gather import JobDirs, LeftOnNode, gather_outputs
from ._jobs import JobOutcome, JobStarted, SweepState
from ._records import read_record
from ._redact import redacted
from ._validate import ray_init_kwargs

log = logging.getLogger(__name__)

# The files of the driver's working dir (a temp dir of the launch on the head),
# shared with the launcher (_remote.py): this plugin's source, the job spec it
# sends, the returns it brings home.
PLUGIN_DIR = "plugin"
JOB_SPEC = "job_spec.pkl"
RETURNS = "returns.pkl"
# The running driver's pid, in its working dir.
_PID_FILE = "driver.pid"
# Written in its working dir by the driver and by `gather` once they have tried to
# bring every node's outputs onto the head: {"complete": bool, "left": [{"node":
# IP, "node_id": ID, "paths": [...], "error": why}]}. The launcher tears the
# cluster down only after a complete one (a missing file means the gather did not
# end: outputs may still be on nodes).
GATHER_REPORT = "gather_report.json"
# In its working dir, one JSON line per job start (node, job dir): what `gather`
# fetches after the driver was killed.
_STARTS_FILE = "job_starts.jsonl"


@dataclass(frozen=True)
class JobSpec:
    """What the launching machine sends to the head: serialised as job_spec.pkl."""

    state: SweepState
    jobs: Sequence[Job]
    init: dict[str, Any]
    remote: dict[str, Any]
    # The sweep output dir as the jobs will resolve it (relative to the head's cwd).
    sweep_dir: str
    # Every job's config, composed on the launching machine: the app's config
    # files are not on the cluster.
    configs: Mapping[int, DictConfig]
    # Dir synced up with the user's code, relative to the head driver's working
    # dir or absolute: on every node's sys.path for the jobs.
    code_dir: str | None
    policy: Policy
    # Draw the live display (the user's terminal is one), this wide.
    live: bool
    width: int | None
    # Jobs of the batch taken from an earlier run (resume): for the progress counts.
    already_done: int


def main(spec_path: str, returns_path: str) -> None:
    import ray

    from . import _engine

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    Path(_PID_FILE).write_text(str(os.getpid()))
    with open(spec_path, "rb") as f:
        spec: JobSpec = cloudpickle.load(f)
    if not spec.live:  # the user's output is no terminal: no colour codes in it
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    # Jobs resolve relative dirs against the head's working dir, not the
    # launching machine's (which need not exist here).
    state = dataclasses.replace(spec.state, cwd=os.getcwd())
    runtime_env = dict(spec.init.get("runtime_env") or {})
    # Ray ships these to every node: the jobs there import this very plugin.
    runtime_env.setdefault("py_modules", []).append(_plugin_module())
    if spec.code_dir is not None:
        # Ray ships the working_dir to every node and puts it on the jobs' sys.path.
        runtime_env.setdefault("working_dir", os.path.abspath(spec.code_dir))
    init = ray_init_kwargs(
        {**spec.init, "address": spec.init.get("address") or "auto", "runtime_env": runtime_env}
    )
    log.info(f"Connecting to the cluster's Ray with config: {redacted(init)}")
    ray.init(**init)
    shipped = _engine.ship_state(state)

    def started(event: JobStarted) -> None:
        with open(_STARTS_FILE, "a") as f:
            f.write(json.dumps(dataclasses.asdict(event)) + "\n")

    outcomes = _engine.run_batch_here(
        shipped,
        spec.jobs,
        spec.remote,
        policy=spec.policy,
        # The records, on the head: synced down with the outputs, also after an interruption.
        sweep_dir=Path(spec.sweep_dir).resolve(),
        configs=spec.configs,
        live=spec.live and _have_rich(),
        width=spec.width,
        already_done=spec.already_done,
        # Complete or not, the report tells the launcher (also after a failure).
        gather=lambda job_dirs: _gather(spec.sweep_dir, job_dirs),
        on_started=started,
    )
    tmp = returns_path + ".part"
    with open(tmp, "wb") as out:
        cloudpickle.dump(outcomes, out)
    os.replace(tmp, returns_path)


def driver_command(remote_tmp: str, code_dir: str | None) -> str:
    """The shell command, run on the head, that runs the sweep (`main`)."""
    tmp = shlex.quote(remote_tmp)
    return _command(remote_tmp, f"{tmp}/{JOB_SPEC} {tmp}/{RETURNS}", code_dir)


def gather_command(remote_tmp: str, sweep_dir: Path) -> str:
    """The shell command, run on the head, that gathers after a failure."""
    return _command(remote_tmp, f"gather {shlex.quote(str(sweep_dir))}")


def _command(remote_tmp: str, args: str, code_dir: str | None = None) -> str:
    """`python -m` this module with ARGS in the head's temp dir, with the shipped
    plugin (and the synced code) on its path."""
    tmp = shlex.quote(remote_tmp)
    pythonpath = f"{tmp}/{PLUGIN_DIR}:" + (f"{shlex.quote(code_dir)}:" if code_dir else "")
    return (
        f"cd {tmp} && PYTHONPATH={pythonpath}$PYTHONPATH RAY_DEDUP_LOGS=0 "
        f"python -m hydra_plugins.hydra_ray_launcher._head_driver {args}"
    )


def _plugin_module() -> str:
    return os.path.abspath(f"{PLUGIN_DIR}/hydra_plugins")


def gather_after_failure(sweep_dir: str) -> None:
    """Stop the driver if it still runs (its jobs are cancelled, as on Ctrl-C),
    then gather the outputs the finished jobs wrote on other nodes."""
    import ray

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    pid_file = Path(_PID_FILE)
    if pid_file.is_file():
        _stop(int(pid_file.read_text()))
    ray.init(address="auto", runtime_env={"py_modules": [_plugin_module()]})
    _gather(sweep_dir, _started_job_dirs(Path(sweep_dir).resolve()))


def _started_job_dirs(sweep_dir: Path) -> JobDirs:
    """The job dirs the driver saw jobs start in, and where each job's recorded
    attempt ran (from the records)."""
    job_dirs = JobDirs()
    starts = Path(_STARTS_FILE)
    lines = starts.read_text().splitlines() if starts.is_file() else []
    for line in lines:
        try:
            event = JobStarted(**json.loads(line))
        except (ValueError, TypeError):  # the last line, cut by the driver's death
            continue
        job_dirs.job_started(event)
        outcome = read_record(sweep_dir, event.idx)
        if outcome is not None:
            job_dirs.job_finished(outcome)
    return job_dirs


def _gather(sweep_dir: str, job_dirs: JobDirs) -> None:
    """Gather onto the head (abspath, as the jobs name their dirs), then report."""
    left = gather_outputs(
        Path(os.path.abspath(sweep_dir)), job_dirs, jobs_cwd=os.getcwd(), cwd_is_ours=True
    )
    write_gather_report(left)


def write_gather_report(left: Sequence[LeftOnNode]) -> None:
    """complete=true only if no node's part stayed behind."""
    tmp = f"{GATHER_REPORT}.part"
    report = {"complete": not left, "left": [part.as_json() for part in left]}
    Path(tmp).write_text(json.dumps(report))
    os.replace(tmp, GATHER_REPORT)


def _stop(pid: int, grace_s: float = 15.0) -> None:
    signals = [signal.SIGINT, signal.SIGKILL]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline + 5:  # a zombie stays "alive": give up then
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        if signals and (signals[0] == signal.SIGINT or time.monotonic() > deadline):
            log.info(f"Stopping the driver (pid {pid}) with {signals[0].name}")
            os.kill(pid, signals.pop(0))
        time.sleep(0.2)


def _have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        log.warning("rich is not installed on the head: progress shown as lines")
        return False
    return True


def load_outcomes(path: str) -> list[JobOutcome]:
    with open(path, "rb") as f:
        outcomes = cloudpickle.load(f)
    assert isinstance(outcomes, list)
    return outcomes


if __name__ == "__main__":
    if sys.argv[1] == "gather":
        gather_after_failure(sys.argv[2])
    else:
        main(*sys.argv[1:3])
