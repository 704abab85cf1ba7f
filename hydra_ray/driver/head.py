"""The driver that runs on a cluster's head (the protocol it shares with the
launcher is `hydra_ray.driver.protocol`): connects to the cluster's Ray, runs
the sweep with the same engine as the local launcher, gathers every job's
outputs from the node that wrote them onto the head, and writes the job returns.

    python -m hydra_ray.driver.head JOB_SPEC RETURNS

Submitted through the Jobs API (`ray_jobs`), in the Ray job's working dir:

    python -m hydra_ray.driver.head jobs JOB_SPEC PACK_PLAN

runs the same, then packs the returns, the records and the outputs into one file
in the head's Ray log dir, which the launcher fetches through the dashboard.

When that driver did not finish (Ctrl-C, killed, failed), the launcher runs

    python -m hydra_ray.driver.head gather SWEEP_DIR

which stops it if it still runs, then gathers what the finished jobs wrote on
other nodes, so that sync_down brings it home before the cluster goes.
"""

import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hydra_ray.checks.resources import JobResources
from hydra_ray.checks.validate import ray_init_kwargs
from hydra_ray.core.digest import file_digest
from hydra_ray.core.jobs import JobStarted
from hydra_ray.core.pids import own_pid_line, runs
from hydra_ray.core.records import RECORD_DIR, read_record, write_atomically
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.core.seal import pack_seal
from hydra_ray.core.wire import (
    GATHER_REPORT,
    JOB_SPEC,
    LOWEST_CLUSTER_RAY_TEXT,
    PACK_MARK,
    PACK_OUTPUTS,
    PACK_PLAN,
    PACK_RECORDS,
    PACKAGES,
    PLUGIN_DIR,
    RETURNS,
    STORED,
    older_than_lowest_ray,
)
from hydra_ray.driver.protocol import (
    PackPlan,
    dump_outcomes,
    load_job_spec,
    spec_key,
    stored_sidecar,
)
from hydra_ray.engine.gather import DiskReach, JobDirs, LeftOnNode, gather_outputs
from hydra_ray.engine.worker import ship_state
from hydra_ray.infra.storage import put
from hydra_ray.infra.sync import rsync_command

log = redacting_logger(__name__)


# The running driver's pid and its jobs' stop grace in seconds ("PID GRACE"), in
# its working dir.
_PID_FILE = "driver.pid"
# In its working dir, one JSON line per job start (node, job dir): what `gather`
# fetches after the driver was killed.
_STARTS_FILE = "job_starts.jsonl"


def refuse_an_older_ray() -> None:
    """Which Ray this driver runs on, checked before anything uses it: a Ray
    older than the lowest this plugin works with (a cluster image or setup
    commands that install an old one) ends the driver (exit 1) with a message
    that names both versions and the Python, instead of a failure deep in Ray."""
    import ray

    if older_than_lowest_ray(ray.__version__):
        sys.exit(
            f"The cluster runs Ray {ray.__version__} (in {sys.executable}): the launcher's "
            f"driver needs Ray {LOWEST_CLUSTER_RAY_TEXT} or later on the cluster. Give the "
            f"cluster Ray >= {LOWEST_CLUSTER_RAY_TEXT} (its image, or the cluster YAML's "
            "setup_commands), ideally the Ray of the launching machine"
        )


def main(spec_path: str, returns_path: str, *, in_ray_job: bool = False) -> bytes:
    """`in_ray_job`: submitted through the Jobs API, whose runtime_env (set at
    submission: the code, this plugin, the user's) every task already has; Ray
    refuses a ray.init() runtime_env that repeats its fields. Returns the
    sweep's key, which sealed the records and the returns (and seals the pack)."""
    import ray

    from hydra_ray.engine.run import run_batch_here

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    spec = load_job_spec(spec_path)
    # Written whole: gather_after_failure may read it meanwhile.
    own = own_pid_line().split()
    write_atomically(
        Path(_PID_FILE), " ".join([own[0], f"{spec.policy.stop_grace_s:g}", *own[1:]]).encode()
    )
    if not spec.live:  # the user's output is no terminal: no colour codes in it
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    # Jobs resolve relative dirs against the head's working dir, not the
    # launching machine's (which need not exist here).
    state = dataclasses.replace(spec.state, cwd=os.getcwd())
    runtime_env = dict(spec.init.get("runtime_env") or {})
    # Ray ships these to every node: the jobs there import this very plugin.
    runtime_env.setdefault("py_modules", []).extend(_staged_packages())
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
    outcomes = run_batch_here(
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
        key=spec.key,
    )
    write_atomically(Path(returns_path), dump_outcomes(outcomes, spec.key))
    return spec.key


def main_for_jobs_api(spec_path: str, plan_path: str) -> None:
    """`main`, then the pack, also after a failure or a stop: Ray's `stop_job`
    sends SIGTERM, which cancels the jobs as Ctrl-C does (KeyboardInterrupt)."""
    plan = PackPlan.read(plan_path)

    def interrupt(signum: int, frame: Any) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the pack must not be cut
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    try:
        main(spec_path, RETURNS, in_ray_job=True)
    finally:
        write_pack(plan, spec_key(spec_path))


def write_pack(plan: PackPlan, key: bytes) -> None:
    """Pack into the head's Ray log dir (which the dashboard serves) and say where."""
    import ray

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    if not ray.is_initialized():
        ray.init(address="auto")
    # The node's log dir: the one dir whose files the dashboard's log API serves.
    node = ray._private.worker.global_worker.node
    assert node is not None
    final = _pack(plan, Path(node.get_logs_dir_path()))
    size, sha256 = file_digest(final)
    sweep = Path(plan.sweep_dir).resolve()
    where: dict[str, Any] = {
        "size": size,
        "sha256": sha256,
        # For the launcher to remove, once everything is home: the sweep dir here
        # (sweep_dir_on_cluster keeps it in this Ray job's own working dir; one
        # found elsewhere all the same, through a link, is not removed), and the pack.
        "node_ip": node.node_ip_address,
        "cluster_sweep": str(sweep) if sweep.is_relative_to(Path.cwd()) else None,
    }
    storage = plan.storage
    if storage:
        try:
            _store(storage, final, key)
        except Exception as exc:  # pyarrow missing here, credentials, the network
            log.warning(
                f"The pack could not be put in sync_down.storage={redacted(storage)} ({exc}): "
                "it comes home through the dashboard instead"
            )
        else:
            final.unlink()  # the sweep dir here still holds everything it packed
            where["seal"] = pack_seal(key, final.name, where)
            print(PACK_MARK + json.dumps({**where, "storage": True}), flush=True)
            return
    where.update(
        node_id=ray.get_runtime_context().get_node_id(), file=final.name, pack_path=str(final)
    )
    where["seal"] = pack_seal(key, final.name, where)
    log.info(f"Packed the results and outputs to bring home: {size / 2**20:.1f} MiB")
    print(PACK_MARK + json.dumps(where), flush=True)


def store_pack(plan: PackPlan, key: bytes) -> None:
    """The cluster launchers' driver, once its jobs ended and their outputs are
    on the head: their results in sync_down.storage, so that they need not wait
    on the head for a launcher that is gone (a resume fetches them there), and
    STORED in the working dir saying so. On failure the results stay on the
    head only, as without a storage."""
    storage = str(plan.storage)
    try:
        final = _pack(plan, Path.cwd())
        try:
            where = _store(storage, final, key)
            with tempfile.TemporaryDirectory(prefix="hydra-ray-stored-") as tmp:
                sidecar = Path(tmp) / stored_sidecar(final.name)
                sidecar.write_text(json.dumps(where))
                put(storage, sidecar, sidecar.name)
        finally:
            final.unlink()  # the sweep dir here still holds everything it packed
    except Exception as exc:  # pyarrow missing here, credentials, the network, a full disk
        log.warning(
            f"The results could not be put in sync_down.storage={redacted(storage)} ({exc}): "
            "they wait on the head"
        )
        return
    write_atomically(Path(STORED), json.dumps(where).encode())


def _store(storage: str, pack: Path, key: bytes) -> dict[str, Any]:
    """Put `pack` in the storage; where it is, its size, sha256 and seal (see STORED)."""
    size, sha256 = file_digest(pack)
    stored = put(storage, pack, pack.name)
    where: dict[str, Any] = {"storage": storage, "key": pack.name, "size": size, "sha256": sha256}
    where["seal"] = pack_seal(key, pack.name, where)
    log.info(f"Put the results ({size / 2**20:.1f} MiB) in {redacted(storage)} as {stored}")
    return where


def _pack(plan: PackPlan, dest: Path) -> Path:
    """One tar in `dest`, named plan.name: the returns and the gather report
    (if written, in the working dir), the records, and the outputs (the sweep
    dir, or plan.outputs_dir, filtered by plan's include/exclude)."""
    sweep = Path(plan.sweep_dir).resolve()
    outputs = Path(plan.outputs_dir or sweep).resolve()
    part = dest / f"{plan.name}.part"
    with tempfile.TemporaryDirectory(prefix="hydra-ray-down-") as tmp:
        if outputs.is_dir() and (plan.include or plan.exclude):
            filtered = Path(tmp)
            cmd = rsync_command(
                f"{outputs}/", f"{filtered}/", include=plan.include, exclude=plan.exclude
            )
            try:
                subprocess.run(cmd, check=True)
            except (OSError, subprocess.CalledProcessError) as exc:
                log.warning(f"sync_down's include/exclude not applied ({exc}): all comes home")
            else:
                outputs = filtered
        with tarfile.open(part, "w") as tar:
            for name in (RETURNS, GATHER_REPORT):
                if Path(name).is_file():
                    tar.add(name, arcname=name)
            if (sweep / RECORD_DIR).is_dir():
                tar.add(sweep / RECORD_DIR, arcname=PACK_RECORDS)
            if outputs.is_dir():
                tar.add(outputs, arcname=PACK_OUTPUTS, filter=_not_records)
    final = dest / plan.name
    os.replace(part, final)
    return final


def _not_records(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if member.name.startswith(f"{PACK_OUTPUTS}/{RECORD_DIR}") else member


def _staged_packages() -> list[str]:
    """The plugin's packages as staged in the working dir, for Ray's py_modules."""
    return [os.path.abspath(f"{PLUGIN_DIR}/{package}") for package in PACKAGES]


def gather_after_failure(sweep_dir: str) -> None:
    """Stop the driver if it still runs (its jobs are cancelled, as on Ctrl-C),
    then gather the outputs the finished jobs wrote on other nodes."""
    import ray

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    pid_file = Path(_PID_FILE)
    if pid_file.is_file():
        pid, grace_s, *start = pid_file.read_text().split()
        # Its jobs' grace (Ctrl-C lets them save their work), then its own.
        _stop(int(pid), start[0] if start else None, float(grace_s) + 15.0)
    ray.init(address="auto", runtime_env={"py_modules": _staged_packages()})
    _gather(sweep_dir, _started_job_dirs(Path(sweep_dir).resolve(), spec_key(JOB_SPEC)))


def _started_job_dirs(sweep_dir: Path, key: bytes) -> JobDirs:
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
        outcome = read_record(sweep_dir, event.idx, key)
        if outcome is not None:
            job_dirs.job_finished(outcome)
    return job_dirs


def _gather(sweep_dir: str, job_dirs: JobDirs) -> None:
    """Gather onto the head (abspath, as the jobs name their dirs), then report."""
    left = gather_outputs(
        Path(os.path.abspath(sweep_dir)),
        job_dirs,
        jobs_cwd=os.getcwd(),
        cwd_is_ours=True,
        reach=_over_ssh(os.getcwd()),
    )
    write_gather_report(left)


# Where Ray's cluster launcher puts, on the head, the cluster's config for its
# autoscaler: with the user and key that reach every node over ssh.
_BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"


def _over_ssh(jobs_cwd: str) -> DiskReach | None:
    """The head's way to the disk of a node whose Ray is gone (killed, or
    restarted under another node id): ssh, as the cluster's autoscaler reaches
    its nodes. None where there is no such config (not a head made by Ray's
    cluster launcher) or the jobs ran in docker containers (their files are not
    on the node's own disk)."""
    path = Path(_BOOTSTRAP_CONFIG).expanduser()
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None
    if not isinstance(config, dict):
        return None
    auth, docker = config.get("auth") or {}, config.get("docker") or {}
    user, key = auth.get("ssh_user"), auth.get("ssh_private_key")
    if not user or not key or docker.get("container_name"):
        return None
    ssh = [
        "ssh",
        "-i",
        os.path.expanduser(str(key)),
        *("-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"),
        *("-o", "BatchMode=yes", "-o", "ConnectTimeout=20", "-o", "LogLevel=ERROR"),
    ]

    def run(cmd: list[str]) -> None:
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as exc:
            raise OSError(f"{cmd[0]} exited {exc.returncode}: {exc.stderr.strip()}") from None

    def reach(node: str, dirs: list[str], winning: set[str]) -> None:
        if not dirs:
            return
        host = f"{user}@{node}"
        # The recorded attempts' files win; others only fill what is missing.
        for job_dir in sorted(dirs, key=lambda d: d not in winning):
            Path(job_dir).mkdir(parents=True, exist_ok=True)
            keep = [] if job_dir in winning else ["--ignore-existing"]
            run(["rsync", "-a", *keep, "-e", shlex.join(ssh), f"{host}:{job_dir}/", f"{job_dir}/"])
        # Here now: removed there, then the dirs left empty up to the jobs' cwd.
        gone = " ".join(shlex.quote(d) for d in dirs)
        tidy = f"find {shlex.quote(jobs_cwd)} -depth -type d -empty -delete"
        run([*ssh, host, f"rm -rf {gone} && {{ {tidy}; true; }}"])

    return reach


def write_gather_report(left: Sequence[LeftOnNode]) -> None:
    """complete=true only if no node's part stayed behind."""
    report = {"complete": not left, "left": [part.as_json() for part in left]}
    write_atomically(Path(GATHER_REPORT), json.dumps(report).encode())


def _stop(pid: int, start: str | None, grace_s: float) -> None:
    """SIGINT (the driver cancels its jobs, as on Ctrl-C), SIGKILL `grace_s` later;
    only while the process `pid` is the driver that started at `start` (a pid
    reused since is another's process)."""
    signals = [signal.SIGINT, signal.SIGKILL]
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline + 5:  # a zombie stays "alive": give up then
        if not runs(pid, start):
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


if __name__ == "__main__":
    refuse_an_older_ray()
    if sys.argv[1] == "gather":
        gather_after_failure(sys.argv[2])
    elif sys.argv[1] == "jobs":
        main_for_jobs_api(*sys.argv[2:4])
    else:
        sweep_key = main(*sys.argv[1:3])
        # The cluster launchers' plan, when results go to sync_down.storage.
        if Path(PACK_PLAN).is_file():
            store_pack(PackPlan.read(PACK_PLAN), sweep_key)
