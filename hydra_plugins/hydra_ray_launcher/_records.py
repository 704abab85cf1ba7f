"""What a sweep leaves in its sweep dir, besides the jobs' own outputs:

- `.hydra_ray/job_<N>.pkl`: the outcome of job N (its JobReturn included), written
  atomically when the launcher's driver receives it; `resume` returns the
  succeeded ones instead of running them again.
- `.hydra_ray/sweep.json`: the sweep's overrides and every job's, to refuse a
  resume of a different sweep.
- `sweep_summary.json`: every job's status, duration, attempts, node and error.
"""

import contextlib
import datetime
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import OmegaConf

from ._jobs import INTERRUPTED, SUCCEEDED, JobOutcome

log = logging.getLogger(__name__)

RECORD_DIR = ".hydra_ray"
SUMMARY_FILE = "sweep_summary.json"
_MANIFEST = "sweep.json"


def _write_atomically(path: Path, data: bytes) -> None:
    """Readers see the old file or the whole new one, never a part: a job killed
    half way is never taken as completed. No fsync (2 ms a job): after an OS crash
    a record may be empty, which reads as missing, and the job runs again."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp's 0600 would hide it from the user's group
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def record_path(sweep_dir: Path, idx: int) -> Path:
    return sweep_dir / RECORD_DIR / f"job_{idx}.pkl"


def write_record(sweep_dir: Path, outcome: JobOutcome) -> None:
    _write_atomically(record_path(sweep_dir, outcome.idx), cloudpickle.dumps(outcome))


def read_record(sweep_dir: Path, idx: int) -> JobOutcome | None:
    path = record_path(sweep_dir, idx)
    if not path.is_file():
        return None
    try:
        with path.open("rb") as f:
            outcome = cloudpickle.load(f)
    except Exception as exc:  # e.g. a return value whose class is gone: run the job again
        log.warning(f"Cannot read {path} ({type(exc).__name__}: {exc}): job #{idx} runs again")
        return None
    return outcome if isinstance(outcome, JobOutcome) else None


def read_manifest(sweep_dir: Path) -> dict[str, Any] | None:
    path = sweep_dir / RECORD_DIR / _MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        if isinstance(manifest, dict) and {"task_overrides", "jobs"} <= manifest.keys():
            return manifest
    except ValueError:
        pass
    log.warning(f"{path} is not a sweep manifest of this launcher: ignored")
    return None


def remove_record(sweep_dir: Path, idx: int) -> None:
    record_path(sweep_dir, idx).unlink(missing_ok=True)


def write_manifest(
    sweep_dir: Path, task_overrides: Sequence[str], jobs: Mapping[int, Sequence[str]]
) -> None:
    manifest = {
        "task_overrides": list(task_overrides),
        "jobs": {str(idx): list(ov) for idx, ov in sorted(jobs.items())},
    }
    _write_atomically(
        sweep_dir / RECORD_DIR / _MANIFEST, json.dumps(manifest, indent=1).encode() + b"\n"
    )


def clear_records(sweep_dir: Path) -> None:
    """Forget an earlier sweep in this dir: a later resume must not take its jobs."""
    shutil.rmtree(sweep_dir / RECORD_DIR, ignore_errors=True)


def write_summary(
    sweep_dir: Path, task_overrides: Sequence[str], outcomes: Iterable[JobOutcome]
) -> Path:
    jobs = [_summary_entry(o) for o in sorted(outcomes, key=lambda o: o.idx)]
    counts: dict[str, int] = {}
    for job in jobs:
        counts[job["status"]] = counts.get(job["status"], 0) + 1
    summary = {
        "sweep_dir": str(sweep_dir.resolve()),
        "task_overrides": list(task_overrides),
        "counts": counts,
        "jobs": jobs,
    }
    path = sweep_dir / SUMMARY_FILE
    _write_atomically(path, json.dumps(summary, indent=1).encode() + b"\n")
    return path


def _summary_entry(o: JobOutcome) -> dict[str, Any]:
    ret = o.job_return
    ran = o.status != INTERRUPTED
    output_dir = (
        OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir") if ret.hydra_cfg else None
    )
    return {
        "idx": o.idx,
        "overrides": list(ret.overrides or []),
        "status": o.status,
        "resumed": o.resumed,
        "attempts": o.attempt,
        "duration_s": round(o.duration, 3) if ran else None,
        "started": _iso(o.started) if ran else None,
        "ended": _iso(o.ended) if ran else None,
        "node": o.node or None,
        "output_dir": output_dir,
        "error": o.error,
        "return_value": _jsonable(ret._return_value) if o.status == SUCCEEDED else None,
    }


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _jsonable(value: Any) -> Any:
    """The return value as JSON if it is plain data, else its repr (cut short)."""
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        text = repr(value)
        return text if len(text) <= 500 else text[:497] + "..."
