"""What a sweep leaves in its sweep dir, besides the jobs' own outputs:

- `.hydra_ray/job_<N>.pkl`: the outcome of job N (its JobReturn included), written
  atomically when the launcher's driver receives it, sealed with the sweep's
  key (core.seal: read only if it verifies); `resume` returns the succeeded
  ones instead of running them again.
- `.hydra_ray/sweep.json`: the sweep's overrides and every job's, to refuse a
  resume of a different sweep.
- `sweep_summary.json`: every job's status, duration, attempts, node, error and
  return value (JSON has no NaN or Infinity: those floats are written as the
  strings "NaN", "Infinity" and "-Infinity").

Nothing here deletes a record of a job that succeeded: an earlier sweep's files
are moved aside, and a record that cannot be read is reported, not dropped.
The records, the manifest and the notes of detached runs are 0600: they hold
the jobs' overrides and configs as run, secrets too (`+api_token=...`), and
only this user's launcher can use them (core.seal). The summary, a file to
share with secrets hidden, gets the mode a plain open() gives under the umask.
"""

import contextlib
import copy
import dataclasses
import datetime
import functools
import itertools
import json
import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, TypeGuard

import cloudpickle
from omegaconf import open_dict, read_write

from hydra_ray.core.errors import UnreadableRecord
from hydra_ray.core.held import HeldJobReturn, hold, output_dir
from hydra_ray.core.jobs import INTERRUPTED, SUCCEEDED, JobOutcome
from hydra_ray.core.redact import redacted, redacted_hydra_config, redacting_logger
from hydra_ray.core.seal import seal, unseal

log = redacting_logger(__name__)

RECORD_DIR = ".hydra_ray"
SUMMARY_FILE = "sweep_summary.json"
MANIFEST = "sweep.json"
# In RECORD_DIR: where a new sweep moves an earlier sweep's files
# (EARLIER-<time>), and where the user may move records a resume cannot read.
EARLIER = "earlier"
UNREADABLE = "unreadable"
_PROC_STATUS = "/proc/self/status"


@dataclass(frozen=True)
class Manifest:
    """What `.hydra_ray/sweep.json` holds: the sweep's overrides and every job's."""

    task_overrides: list[str]
    jobs: dict[int, list[str]]


def _umask() -> int:
    """The process's umask, read without changing it: os.umask sets it for every
    thread, and a file another thread creates meanwhile would get the wrong mode."""
    with contextlib.suppress(OSError, ValueError), open(_PROC_STATUS) as status:
        for line in status:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return _umask_set_and_restored()


@functools.cache
def _umask_set_and_restored() -> int:
    """Where /proc has no umask (macOS, old kernels): set and restore it, once."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_atomically(path: Path, data: bytes, *, private: bool = False) -> None:
    """Readers see the old file or the whole new one, never a part: a job killed
    half way is never taken as completed. No fsync (2 ms a job): after an OS crash
    a record may be empty, which reads as missing, and the job runs again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            # mkstemp makes 0600: kept for a `private` file; else the user's umask
            # decides, as for any file they write.
            if not private:
                os.fchmod(f.fileno(), 0o666 & ~_umask())
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_path(sweep_dir: Path, idx: int) -> Path:
    return sweep_dir / RECORD_DIR / f"job_{idx}.pkl"


def write_record(sweep_dir: Path, outcome: JobOutcome, key: bytes) -> None:
    """Sealed with the sweep's `key` (see core.seal), for job `outcome.idx` only."""
    data = cloudpickle.dumps(_for_disk(outcome))
    sealed = seal(key, _purpose(outcome.idx), data)
    write_atomically(record_path(sweep_dir, outcome.idx), sealed, private=True)


def _purpose(idx: int) -> str:
    return f"record of job {idx}"


def _for_disk(outcome: JobOutcome) -> JobOutcome:
    """The outcome without the secrets of the launcher's settings (in the job's
    Hydra config): a record is a file the user may share; the sweeper that a
    resume hands it to does not read them."""
    job_return = outcome.job_return
    if isinstance(job_return, HeldJobReturn) and job_return.pickled("hydra_cfg"):
        return outcome  # hidden when it was held
    if job_return.hydra_cfg is None:
        return outcome
    hidden = redacted_hydra_config(job_return.hydra_cfg)
    if hidden is job_return.hydra_cfg:
        return outcome
    job_return = copy.copy(job_return)
    job_return.hydra_cfg = hidden
    return dataclasses.replace(outcome, job_return=job_return)


def read_record(sweep_dir: Path, idx: int, key: bytes) -> JobOutcome | None:
    """Job `idx`'s recorded outcome, or None if it has none or one that cannot be
    read here (logged, and left where it is): for what only needs to know whether
    the job finished. A resume decides with load_record."""
    try:
        return load_record(sweep_dir, idx, key)
    except UnreadableRecord as exc:
        log.warning(f"Cannot read {exc.path} ({exc.why}): job #{idx} taken as not finished")
        return None


def load_record(sweep_dir: Path, idx: int, key: bytes) -> JobOutcome | None:
    """Job `idx`'s recorded outcome, or None if it has none (or an empty one, which
    only an OS crash leaves and which holds nothing to keep). Raises
    UnreadableRecord if the record exists but cannot be read here, or is not
    sealed with the sweep's `key` as job `idx`'s (then nothing of it is unpickled)."""
    path = record_path(sweep_dir, idx)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UnreadableRecord(path, f"{type(exc).__name__}: {exc}") from exc
    if not data:
        log.warning(f"{path} is empty (written just before an OS crash?): job #{idx} not finished")
        return None
    try:
        data = unseal(key, _purpose(idx), data)
    except ValueError as exc:
        raise UnreadableRecord(path, str(exc)) from exc
    try:
        outcome = cloudpickle.loads(data)
    except Exception as exc:  # unpickling runs the classes' own code: it can raise anything
        raise UnreadableRecord(path, f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(outcome, JobOutcome):
        raise UnreadableRecord(path, f"holds a {type(outcome).__name__}, not a job's outcome")
    return outcome


def moved_home(outcome: JobOutcome, sweep_dir: str, home: Path) -> JobOutcome:
    """The outcome of a job that ran on a cluster, with its output dir (and its
    working dir, if it was that) where its files came home: `home` (the local
    sweep dir, or sync_down.target_dir) joined with the part of the cluster's
    output dir below `sweep_dir`, the sweep dir as the jobs were given it
    (relative to each node's working dir, or absolute). Unchanged if the output
    dir is not below it (then nothing says where its files went)."""
    ret = outcome.job_return
    there = output_dir(ret)
    if there is None:
        return outcome
    below = _below(PurePosixPath(there), PurePosixPath(os.path.normpath(sweep_dir)))
    if below is None:
        return outcome
    here = os.path.abspath(home / below)
    if here == there:
        return outcome
    hydra_cfg = copy.deepcopy(ret.hydra_cfg)
    assert hydra_cfg is not None
    runtime = hydra_cfg.hydra.runtime
    with read_write(runtime), open_dict(runtime):  # as Hydra's run_job sets it
        runtime.output_dir = here
    moved = copy.copy(ret)
    moved.hydra_cfg = hydra_cfg
    if ret.working_dir == there or _same_job_dir(ret.working_dir, sweep_dir, below):
        moved.working_dir = here  # hydra.job.chdir=true
    held = isinstance(ret, HeldJobReturn)
    return dataclasses.replace(outcome, job_return=hold(moved) if held else moved)


def _same_job_dir(working_dir: str | None, sweep_dir: str, below: PurePosixPath) -> bool:
    """Whether a working dir as Hydra's run_job gives it with hydra.job.chdir
    (the job's dir as configured: relative when the sweep dir was, e.g.
    `sweep/3`) is the output dir whose part below `sweep_dir` is `below`."""
    if not working_dir or os.path.isabs(working_dir) or os.path.isabs(sweep_dir):
        return False
    path = PurePosixPath(os.path.normpath(working_dir))
    top = PurePosixPath(os.path.normpath(sweep_dir))
    n = len(top.parts)
    return path.parts[:n] == top.parts and PurePosixPath(*path.parts[n:]) == below


def _below(path: PurePosixPath, top: PurePosixPath) -> PurePosixPath | None:
    """`path`'s part below `top`: an absolute `top` only at its start, a relative
    one at its last place in `path` (the node's working dir comes before it)."""
    n = len(top.parts)
    starts = [0] if top.is_absolute() else range(len(path.parts) - n, 0, -1)
    for i in starts:
        if path.parts[i : i + n] == top.parts:
            return PurePosixPath(*path.parts[i + n :])
    return None


def move_records_home(
    sweep_dir: Path, idxs: Iterable[int], given: str, home: Path, key: bytes
) -> None:
    """Rewrite the records of jobs `idxs`, just brought from a cluster into
    `sweep_dir`, with the paths where their files came home (see moved_home): a
    resume hands them to the sweeper, and the summary shows their output dirs."""
    for idx in idxs:
        outcome = read_record(sweep_dir, idx, key)
        if outcome is None:
            continue
        moved = moved_home(outcome, given, home)
        if moved is not outcome:
            write_record(sweep_dir, moved, key)


def job_records(sweep_dir: Path) -> list[Path]:
    """The job records in the sweep dir (not the temp files of killed writers)."""
    return sorted((sweep_dir / RECORD_DIR).glob("job_*.pkl"))


def _strings(value: Any) -> TypeGuard[list[str]]:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def read_manifest(sweep_dir: Path) -> Manifest | None:
    """The earlier sweep's manifest, or None if the dir has none. Raises
    UnreadableRecord if it has one that cannot be read or has another shape."""
    path = sweep_dir / RECORD_DIR / MANIFEST
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise UnreadableRecord(path, f"{type(exc).__name__}: {exc}") from exc
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise UnreadableRecord(path, f"not JSON ({exc})") from exc
    task_overrides = manifest.get("task_overrides") if isinstance(manifest, dict) else None
    jobs = manifest.get("jobs") if isinstance(manifest, dict) else None
    if not (
        _strings(task_overrides)
        and isinstance(jobs, dict)
        and all(idx.isdecimal() and _strings(ov) for idx, ov in jobs.items())
    ):
        raise UnreadableRecord(
            path,
            'not a sweep manifest of this launcher: {"task_overrides": [overrides], '
            '"jobs": {"<job number>": [overrides], ...}} expected',
        )
    return Manifest(list(task_overrides), {int(idx): list(ov) for idx, ov in jobs.items()})


def remove_record(sweep_dir: Path, idx: int) -> None:
    """For the record of a job that did not succeed, which its rerun replaces."""
    record_path(sweep_dir, idx).unlink(missing_ok=True)


def write_manifest(
    sweep_dir: Path, task_overrides: Sequence[str], jobs: Mapping[int, Sequence[str]]
) -> None:
    manifest = {
        "task_overrides": list(task_overrides),
        "jobs": {str(idx): list(ov) for idx, ov in sorted(jobs.items())},
    }
    write_atomically(
        sweep_dir / RECORD_DIR / MANIFEST,
        json.dumps(manifest, indent=1).encode() + b"\n",
        private=True,
    )


def set_earlier_sweep_aside(sweep_dir: Path) -> Path | None:
    """Move an earlier sweep's records, manifest and summary out of a later
    resume's way, into `.hydra_ray/earlier-<time>/` (returned; None if there were
    none): a new sweep must not take its jobs, and nothing it finished is deleted."""
    record_dir = sweep_dir / RECORD_DIR
    files = sorted(p for p in record_dir.glob("*") if p.is_file()) if record_dir.is_dir() else []
    if not files:
        return None
    if (sweep_dir / SUMMARY_FILE).is_file():
        files.append(sweep_dir / SUMMARY_FILE)
    stamp = datetime.datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    for n in itertools.count():
        aside = record_dir / (f"{EARLIER}-{stamp}" + (f"-{n}" if n else ""))
        try:
            aside.mkdir()
            break
        except FileExistsError:  # two sweeps started over in the same second
            continue
    for path in files:
        path.rename(aside / path.name)
    return aside


def write_summary(
    sweep_dir: Path, task_overrides: Sequence[str], outcomes: Iterable[JobOutcome]
) -> Path:
    jobs = [_summary_entry(o) for o in sorted(outcomes, key=lambda o: o.idx)]
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    summary = {
        "sweep_dir": str(sweep_dir.resolve()),
        "task_overrides": [redacted(o) for o in task_overrides],
        "counts": counts,
        "jobs": jobs,
    }
    path = sweep_dir / SUMMARY_FILE
    # Strict JSON: jq and JavaScript refuse NaN and Infinity.
    write_atomically(path, json.dumps(summary, indent=1, allow_nan=False).encode() + b"\n")
    return path


def _summary_entry(o: JobOutcome) -> dict[str, Any]:
    ret = o.job_return
    ran = o.status != INTERRUPTED
    return {
        "idx": o.idx,
        # The summary is a file to share: a secret's value (`+api_token=...`) hidden.
        "overrides": [redacted(o) for o in ret.overrides or []],
        "status": o.status,
        "resumed": o.resumed,
        "attempts": o.attempt,
        "ray_reruns": o.ray_reruns,
        "duration_s": round(o.duration, 3) if ran else None,
        "started": _iso(o.started) if ran else None,
        "ended": _iso(o.ended) if ran else None,
        "node": o.node or None,
        "resources": o.resources,
        "output_dir": output_dir(ret),
        "error": o.error,
        "outputs_left": o.outputs_left or None,
        "return_value": _jsonable(ret._return_value) if o.status == SUCCEEDED else None,
    }


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    """The return value as JSON if it is plain data (non-finite floats as strings),
    else its repr (cut short)."""
    try:
        plain = _finite(value, frozenset())
        json.dumps(plain, allow_nan=False)  # e.g. a NaN dict key, an object
        return plain
    except (TypeError, ValueError, RecursionError):
        text = repr(value)
        return text if len(text) <= 500 else text[:497] + "..."


def _finite(value: Any, containing: frozenset[int]) -> Any:
    """`value` with every non-finite float in it, at any depth, as the string
    JavaScript prints for it ("NaN", "Infinity", "-Infinity")."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if isinstance(value, (dict, list, tuple)):
        if id(value) in containing:
            raise ValueError("a container that contains itself")
        containing = containing | {id(value)}
        if isinstance(value, dict):
            return {k: _finite(v, containing) for k, v in value.items()}
        return [_finite(v, containing) for v in value]
    return value


def detached_runs(sweep_dir: Path, name: str) -> dict[str, dict[str, Any]]:
    """The runs of this sweep that go on without the launcher, noted in the
    record dir's file `name`: {run id: {"jobs": [idx, ...], "home": bool}}. A
    Ray job (`ray_jobs`) or a driver on a cluster's head: a resume follows one
    whose results did not come home (the launcher was killed, or its connection)."""
    path = sweep_dir / RECORD_DIR / name
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:  # cut by a kill mid-write: what it held is lost
        log.warning(f"Cannot read {path} ({exc}): no earlier run is followed again")
        return {}
    return found if isinstance(found, dict) else {}


def note_detached_run(
    sweep_dir: Path,
    name: str,
    run_id: str,
    jobs: list[int],
    *,
    home: bool = False,
    more: Mapping[str, Any] | None = None,
) -> None:
    """Note (atomically) a detached run of `jobs`, before it starts: a launcher
    killed right after leaves a run that a resume must find. `more`: what else
    the resume needs (where the run puts its results)."""
    noted = detached_runs(sweep_dir, name)
    noted[run_id] = {**(more or {}), "jobs": jobs, "home": home}
    write_atomically(
        sweep_dir / RECORD_DIR / name, json.dumps(noted, indent=1).encode(), private=True
    )


def note_detached_run_home(sweep_dir: Path, name: str, run_id: str) -> None:
    """The run's results came home (or there is nothing to fetch): a resume
    leaves it alone."""
    noted = dict(detached_runs(sweep_dir, name).get(run_id) or {})
    jobs = [int(i) for i in noted.pop("jobs", [])]
    noted.pop("home", None)
    note_detached_run(sweep_dir, name, run_id, jobs, home=True, more=noted)
