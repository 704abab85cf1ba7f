"""The head-driver protocol: what the launching machine and the driver on a
cluster's head (`hydra_ray.driver.head`) share, typed: the job spec the
launcher builds and sends, the plugin staged beside it, the plan of the pack
that brings results home (`PackPlan`), the commands that run the driver, and
the pack's check and unpacking. The names of the files and markers both
sides use are in `core.wire`.

Both sides import this module; it imports the data types and the seals of
`core`, no Ray.
"""

import dataclasses
import importlib.util
import json
import os
import pickle
import shlex
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import DictConfig

from hydra_ray import FACE
from hydra_ray.core.errors import Unauthentic
from hydra_ray.core.jobs import Job, JobOutcome, Policy, SweepState
from hydra_ray.core.pids import pid_in, still_runs, write_own_pid
from hydra_ray.core.records import RECORD_DIR
from hydra_ray.core.seal import check_pack_seal, seal, unseal
from hydra_ray.core.untar import extract_within
from hydra_ray.core.wire import (
    DRIVER_LOG,
    DRIVER_MODULE,
    DRIVER_RC,
    HEAD_SWEEP_DIR,
    JOB_SPEC,
    PACK_OUTPUTS,
    PACK_RECORDS,
    PLUGIN_DIR,
    PYTHON_MARK,
    RETURNS,
    STATE_MARK,
    WRAPPER_PID,
)


def stored_sidecar(key: str) -> str:
    """The name, in the storage, of the file that says the pack `key` is whole."""
    return f"{key}.json"


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
    # The sweep's key (core.seal): the driver seals its records, returns and pack
    # with it; it goes nowhere else (no job gets it).
    key: bytes


@dataclass(frozen=True)
class PackPlan:
    """What the driver packs (one tar: the returns, the gather report, the
    records, the outputs) and where it puts the pack: PACK_PLAN in its working
    dir. The `ray_jobs` launcher's driver always packs (the pack comes home
    through the dashboard, or the storage); the cluster launchers' only with
    sync_down.storage."""

    # The pack's file name, chosen by the launcher (a resume fetches it by that name).
    name: str
    # The sweep dir as the jobs on the cluster name it.
    sweep_dir: str
    # sync_down's filters, applied before packing.
    include: list[str]
    exclude: list[str]
    # sync_down.storage: the URI may hold credentials, so the plan is a 0600
    # file and never a command line.
    storage: str | None = None
    # The dir whose outputs are packed when sync_down.source_dir names another
    # than the sweep dir (as rsync names it on the head: relative to home).
    outputs_dir: str | None = None

    def write(self, path: Path) -> None:
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            json.dump(dataclasses.asdict(self), f)

    @classmethod
    def read(cls, path: str | Path) -> "PackPlan":
        return cls(**json.loads(Path(path).read_text()))


def write_job_spec(path: Path, spec: JobSpec, pickled: bytes) -> None:
    """JOB_SPEC, 0600 (it holds the sweep's key and the app's config): the key
    first, as a pickle of bytes that `spec_key` reads alone, then `pickled`
    (the spec, as dumps_for_cluster makes it). A spec that cannot load on the
    cluster (a module of the app's it lacks) still gives its key to the pack
    that reports the failure."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
        f.write(pickle.dumps(bytes(spec.key)))
        f.write(pickled)


def spec_key(path: str) -> bytes:
    """The sweep's key, from the job spec at `path`."""
    with open(path, "rb") as f:
        key = pickle.load(f)
    assert isinstance(key, bytes)
    return key


def load_job_spec(path: str) -> JobSpec:
    with open(path, "rb") as f:
        pickle.load(f)  # the key
        spec = cloudpickle.load(f)
    assert isinstance(spec, JobSpec)
    return spec


def sweep_dir_on_cluster(sweep_dir: str) -> str:
    """The sweep dir as the jobs on the cluster name it (relative to the head
    driver's working dir): hydra.sweep.dir, normalized, if relative and inside
    that dir, else HEAD_SWEEP_DIR."""
    inside = os.path.normpath(sweep_dir)
    if os.path.isabs(inside) or inside == "." or inside.split(os.sep)[0] == "..":
        return HEAD_SWEEP_DIR
    return inside


def sweep_dir_as_given(sweep_dir: str) -> str | None:
    """hydra.sweep.dir where the cluster uses it as it is (relative, inside the
    driver's working dir); None where it has a name of the launcher's own there."""
    there = sweep_dir_on_cluster(sweep_dir)
    return there if there != HEAD_SWEEP_DIR else None


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
    """The shell command, run on the head, that starts the sweep's driver (`main`)
    detached from the command's session: it goes on when the launcher, its SSH
    session or its network goes. It returns at once; `follow_command` shows the
    driver's output until it ends. The driver's output goes to DRIVER_LOG, its
    exit status to DRIVER_RC, its wrapper's pid to WRAPPER_PID."""
    tmp = shlex.quote(remote_tmp)
    driver = _python(remote_tmp, f"{tmp}/{JOB_SPEC} {tmp}/{RETURNS}", code_dir)
    wrapped = f"{write_own_pid(WRAPPER_PID)}; {driver}; echo $? > {DRIVER_RC}"
    return (
        f"cd {tmp} && rm -f {DRIVER_RC} {WRAPPER_PID} && "
        f"setsid nohup sh -c {shlex.quote(wrapped)} > {DRIVER_LOG} 2>&1 < /dev/null &"
    )


def follow_command(remote_tmp: str, *, from_start: bool) -> str:
    """The shell command, run on the head, that streams the driver's output (all
    of it, or from now on) until the driver ends, and exits with its status (137
    when it was killed before it could write one). Ends by itself when its SSH
    session goes; the driver does not."""
    tmp = shlex.quote(remote_tmp)
    lines = "+1" if from_start else "0"
    return (
        f"cd {tmp} && for _ in $(seq 100); do [ -s {WRAPPER_PID} ] && break; sleep 0.2; done; "
        f"tail -n {lines} -F --pid={pid_in(WRAPPER_PID)} {DRIVER_LOG} 2>/dev/null; "
        f"if [ -s {DRIVER_RC} ]; then exit $(cat {DRIVER_RC}); else exit 137; fi"
    )


def driver_state_command(remote_tmp: str) -> str:
    """The shell command, run on the head, that prints the driver's state after
    STATE_MARK: `running`, `ended RC`, `killed` (ended without a status) or
    `gone` (the launch's dir is not there)."""
    tmp = shlex.quote(remote_tmp)
    return (
        f'if [ ! -d {tmp} ]; then echo "{STATE_MARK}gone"; '
        f'elif [ -s {tmp}/{DRIVER_RC} ]; then echo "{STATE_MARK}ended $(cat {tmp}/{DRIVER_RC})"; '
        f"elif [ -s {tmp}/{WRAPPER_PID} ] && {still_runs(f'{tmp}/{WRAPPER_PID}')}; "
        f'then echo "{STATE_MARK}running"; else echo "{STATE_MARK}killed"; fi'
    )


def ray_job_entrypoint(python: str | None, args: str) -> str:
    """The shell command of a Ray job of ours: Python with ARGS (`-m DRIVER_MODULE
    ...` for the sweep's driver, `-c ...` for a cleanup), run by
    `python` if given, else by the Python that runs the cluster's Ray, found
    whatever the head's PATH says (a `ray start` run as /venv/bin/ray from a
    systemd unit has its venv's Python, and PATH another): Ray's job supervisor
    runs this shell, and the raylet, the supervisor's parent, names that Python
    first in its --python_worker_command (every Ray since 1.x). Where that
    cannot be read (no /proc: a macOS head), `python` on PATH. The first line of
    the log names the Python chosen (PYTHON_MARK)."""
    driver = f'RAY_DEDUP_LOGS=0 exec "$py" {args}'
    if python:
        return f'py={shlex.quote(python)}; echo {PYTHON_MARK}"$py"; {driver}'
    raylet = "$(sed 's/.*) //' /proc/$PPID/stat 2>/dev/null | cut -d' ' -f2)"
    quoted = 's/^--python_worker_command="\\([^"]*\\)".*/\\1/p'
    plain = 's/^--python_worker_command=\\([^" ][^ ]*\\).*/\\1/p'
    find = (
        f"py=$(tr '\\000' '\\n' < /proc/{raylet}/cmdline 2>/dev/null "
        f"| sed -n -e '{quoted}' -e '{plain}' | head -n 1)"
    )
    return f'{find}; [ -x "$py" ] || py=python; echo {PYTHON_MARK}"$py"; {driver}'


def gather_command(remote_tmp: str, sweep_dir: Path) -> str:
    """The shell command, run on the head, that gathers after a failure."""
    tmp = shlex.quote(remote_tmp)
    return f"cd {tmp} && {_python(remote_tmp, f'gather {shlex.quote(str(sweep_dir))}')}"


def _python(remote_tmp: str, args: str, code_dir: str | None = None) -> str:
    """`python -m` the driver with ARGS, with the shipped plugin (and the synced
    code) on its path; run in the head's temp dir."""
    tmp = shlex.quote(remote_tmp)
    pythonpath = f"{tmp}/{PLUGIN_DIR}:" + (f"{shlex.quote(code_dir)}:" if code_dir else "")
    return (
        f"PYTHONPATH={pythonpath}$PYTHONPATH RAY_DEDUP_LOGS=0 PYTHONUNBUFFERED=1 "
        f"python -m {DRIVER_MODULE} {args}"
    )


def extract_pack(
    pack: Path, into: Path, sweep_dir: Path, outputs_to: Path
) -> tuple[list[int], Path | None]:
    """Unpack `pack` (PACK_PLAN's tar) in `into`; its records into
    `sweep_dir`'s record dir, its outputs into `outputs_to`. The jobs whose
    records came, and where the returns are (None if the driver wrote none)."""
    with tarfile.open(pack) as tar:
        extract_within(tar, into, source=f"the sweep's pack {pack.name}")
    idxs: list[int] = []
    if (into / PACK_RECORDS).is_dir():
        shutil.copytree(into / PACK_RECORDS, sweep_dir / RECORD_DIR, dirs_exist_ok=True)
        came = (p.stem.removeprefix("job_") for p in (into / PACK_RECORDS).glob("job_*.pkl"))
        idxs = sorted(int(i) for i in came if i.isdecimal())
    if (into / PACK_OUTPUTS).is_dir():
        shutil.copytree(into / PACK_OUTPUTS, outputs_to, dirs_exist_ok=True)
    returns = into / RETURNS
    return idxs, returns if returns.is_file() else None


def verify_pack(key: bytes, name: str, said: Mapping[str, Any], source: str) -> None:
    """Raises Unauthentic, naming `source`, unless the pack `name` and what
    `said` says of it carry the sweep's seal (core.seal)."""
    try:
        check_pack_seal(key, name, said)
    except ValueError as exc:
        raise Unauthentic(f"The pack {name} from {source} {exc}") from exc


def dump_outcomes(outcomes: list[JobOutcome], key: bytes) -> bytes:
    """RETURNS' content: the outcomes, sealed with the sweep's key."""
    return seal(key, RETURNS, cloudpickle.dumps(outcomes))


def load_outcomes(path: str, key: bytes) -> list[JobOutcome]:
    """The job outcomes the driver wrote to `path` (RETURNS). Raises
    Unauthentic, having unpickled nothing, unless sealed with the sweep's key."""
    try:
        data = unseal(key, RETURNS, Path(path).read_bytes())
    except ValueError as exc:
        raise Unauthentic(f"The driver's returns {path} {exc}") from exc
    outcomes = cloudpickle.loads(data)
    if not isinstance(outcomes, list):
        raise Unauthentic(f"The driver's returns {path} hold a {type(outcomes).__name__}")
    return outcomes
