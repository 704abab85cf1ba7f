"""The head-driver protocol (the job spec the launching machine builds and
sends, with this plugin staged beside it; the files and commands both sides
share) and the driver that runs on a cluster's head: connects to the cluster's Ray, runs
the sweep with the same engine as the local launcher, gathers every job's
outputs from the node that wrote them onto the head, and writes the job returns.

    python -m hydra_plugins.hydra_ray_launcher._head_driver JOB_SPEC RETURNS

Submitted through the Jobs API (`ray_jobs`), in the Ray job's working dir:

    python -m hydra_plugins.hydra_ray_launcher._head_driver jobs JOB_SPEC BUNDLE_PLAN

runs the same, then packs the returns, the records and the outputs into one file
in the head's Ray log dir, which the launcher fetches through the dashboard.

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
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
from omegaconf import DictConfig

from ._digest import file_digest
from ._gather import JobDirs, LeftOnNode, gather_outputs
from ._jobs import (
    Job,
    JobOutcome,
    JobStarted,
    Policy,
    SweepState,
    capture_sweep_state,
    composed_here,
    ship_state,
)
from ._records import RECORD_DIR, read_record
from ._redact import redacted
from ._resources import JobResources, for_sweep
from ._sync import rsync_command
from ._validate import plain_dict, ray_init_kwargs

if TYPE_CHECKING:
    from ._sweep import Batch, Session, SweepBook

log = logging.getLogger(__name__)

# The files of the driver's working dir (a temp dir of the launch on the head),
# shared with the launcher (_remote.py): this plugin's source, the job spec it
# sends, the returns it brings home.
PLUGIN_DIR = "plugin"
JOB_SPEC = "job_spec.pkl"
RETURNS = "returns.pkl"
# The running driver's pid and its jobs' stop grace in seconds ("PID GRACE"), in
# its working dir.
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


def build_job_spec(
    session: "Session", book: "SweepBook", current: "Batch", code_dir: str | None
) -> JobSpec:
    """What the head's driver needs for the batch, built before anything is sent
    (an app that cannot be pickled fails here, for free). Each job's
    hydra.launcher.ray.remote, where it interpolates into the job's config, is
    resolved here: raises ResourceError for a job whose value does not resolve
    (within the resolution budget: later jobs fail alone, on the head)."""
    context, config = session.hydra_context, session.config
    configs = composed_here(context, config, current.to_run)
    for_sweep(context, config, configs).resolve_ahead(current.to_run)
    return JobSpec(
        state=capture_sweep_state(context, session.task_function, config),
        jobs=current.to_run,
        configs=configs,
        init=plain_dict(config.hydra.launcher.ray.init),
        sweep_dir=str(book.sweep_dir),
        code_dir=code_dir,
        policy=book.settings.policy,
        live=book.settings.live,
        width=shutil.get_terminal_size().columns if book.settings.live else None,
        already_done=current.already_done,
    )


def stage_plugin(staged: Path) -> None:
    """Copy into `staged` (the PLUGIN_DIR that goes to the cluster) this plugin's
    own source, so that the head's driver and the jobs on every node run the very
    code of the launching machine, whatever version is installed there; and rich
    (pure Python), which draws the driver's display: the cluster's packages need
    not include it."""
    import rich

    for source, target in (
        (Path(__file__).parent, staged / "hydra_plugins" / "hydra_ray_launcher"),
        (Path(rich.__file__).parent, staged / "rich"),
    ):
        shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))


def main(spec_path: str, returns_path: str, *, in_ray_job: bool = False) -> None:
    """`in_ray_job`: submitted through the Jobs API, whose runtime_env (set at
    submission: the code, this plugin, the user's) every task already has; Ray
    refuses a ray.init() runtime_env that repeats its fields."""
    import ray

    from . import _engine

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    with open(spec_path, "rb") as f:
        spec: JobSpec = cloudpickle.load(f)
    Path(_PID_FILE).write_text(f"{os.getpid()} {spec.policy.stop_grace_s:g}")
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
        {
            **spec.init,
            # In a Ray job (ray_jobs), Ray sets RAY_ADDRESS to its own cluster.
            "address": spec.init.get("address") or os.environ.get("RAY_ADDRESS") or "auto",
            "runtime_env": None if in_ray_job else runtime_env,
        }
    )
    log.info(f"Connecting to the cluster's Ray with config: {redacted(init)}")
    ray.init(**init)
    shipped = ship_state(state)

    def started(event: JobStarted) -> None:
        with open(_STARTS_FILE, "a") as f:
            f.write(json.dumps(dataclasses.asdict(event)) + "\n")

    # What each job asks for: hydra.launcher.ray.remote, resolved here against each
    # job's config (composed from the state's snapshot) where it interpolates into it.
    resources = JobResources(
        state.config,
        lambda overrides: state.hydra_context.config_loader.load_sweep_config(
            state.config, list(overrides)
        ),
        spec.configs,
    )
    outcomes = _engine.run_batch_here(
        shipped,
        spec.jobs,
        resources,
        policy=spec.policy,
        # The records, on the head: synced down with the outputs, also after an interruption.
        sweep_dir=Path(spec.sweep_dir).resolve(),
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


def main_for_jobs_api(spec_path: str, plan_path: str) -> None:
    """`main`, then the pack, also after a failure or a stop: Ray's `stop_job`
    sends SIGTERM, which cancels the jobs as Ctrl-C does."""
    plan = json.loads(Path(plan_path).read_text())

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pack must not be cut
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        main(spec_path, RETURNS, in_ray_job=True)
    finally:
        write_bundle(plan)


def write_bundle(plan: dict[str, Any]) -> None:
    """Pack into the head's Ray log dir (which the dashboard serves) and say where."""
    import ray

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    if not ray.is_initialized():
        ray.init(address="auto")
    # The node's log dir: the one dir whose files the dashboard's log API serves.
    node = ray._private.worker.global_worker.node
    assert node is not None
    logs = Path(node.get_logs_dir_path())
    sweep = Path(plan["sweep_dir"]).resolve()
    part = logs / f"{plan['name']}.part"
    with tempfile.TemporaryDirectory(prefix="hydra-ray-down-") as tmp:
        outputs = sweep
        if sweep.is_dir() and (plan["include"] or plan["exclude"]):
            outputs = Path(tmp)
            cmd = rsync_command(
                f"{sweep}/", f"{outputs}/", include=plan["include"], exclude=plan["exclude"]
            )
            try:
                subprocess.run(cmd, check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                log.warning(f"sync_down's include/exclude not applied ({exc}): all comes home")
                outputs = sweep
        with tarfile.open(part, "w") as tar:
            for name in (RETURNS, GATHER_REPORT):
                if Path(name).is_file():
                    tar.add(name, arcname=name)
            if (sweep / RECORD_DIR).is_dir():
                tar.add(sweep / RECORD_DIR, arcname=BUNDLE_RECORDS)
            if outputs.is_dir():
                tar.add(outputs, arcname=BUNDLE_OUTPUTS, filter=_not_records)
    final = logs / str(plan["name"])
    os.replace(part, final)
    size, sha256 = file_digest(final)
    where: dict[str, Any] = {
        "size": size,
        "sha256": sha256,
        # For the launcher to remove, once everything is home: the sweep dir here
        # if it is in this Ray job's own working dir (an absolute sweep dir is the
        # user's place on the cluster: kept), and the pack.
        "node_ip": node.node_ip_address,
        "cluster_sweep": str(sweep) if sweep.is_relative_to(Path.cwd()) else None,
    }
    log.info(f"Packed the results and outputs to bring home: {size / 2**20:.1f} MiB")
    storage = plan.get("storage")
    if storage:
        from . import _storage

        try:
            stored = _storage.put(storage, final, final.name)
        except Exception as exc:  # pyarrow missing here, credentials, the network
            log.warning(
                f"The pack could not be put in sync_down.storage={redacted(storage)} ({exc}): "
                "it comes home through the dashboard instead"
            )
        else:
            log.info(f"Put the pack in {redacted(storage)} as {stored}")
            final.unlink()  # the sweep dir here still holds everything it packed
            print(
                BUNDLE_MARK + json.dumps({**where, "storage": storage, "key": final.name}),
                flush=True,
            )
            return
    where.update(
        node_id=ray.get_runtime_context().get_node_id(), file=final.name, pack_path=str(final)
    )
    print(BUNDLE_MARK + json.dumps(where), flush=True)


def _not_records(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if member.name.startswith(f"{BUNDLE_OUTPUTS}/{RECORD_DIR}") else member


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
        pid, _, grace_s = pid_file.read_text().partition(" ")
        # Its jobs' grace (Ctrl-C lets them save their work), then its own.
        _stop(int(pid), float(grace_s or 0) + 15.0)
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


def _stop(pid: int, grace_s: float) -> None:
    """SIGINT (the driver cancels its jobs, as on Ctrl-C), SIGKILL `grace_s` later."""
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
    elif sys.argv[1] == "jobs":
        main_for_jobs_api(*sys.argv[2:4])
    else:
        main(*sys.argv[1:3])
