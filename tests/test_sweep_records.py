"""The sweep's records, resume plan, summary and table, in-process: no Ray, no
subprocess. Jobs' outcomes are built by hand."""

import importlib
import json
import logging
import math
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_plugins.hydra_ray_launcher._config import RayLauncherConf
from hydra_ray.core import records as _records
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.jobs import FAILED, INTERRUPTED, SUCCEEDED, TIMED_OUT, Job, JobOutcome, Policy
from hydra_ray.core.records import (
    RECORD_DIR,
    SUMMARY_FILE,
    read_record,
    record_path,
    write_manifest,
    write_record,
    write_summary,
)
from hydra_ray.core.seal import SWEEP_ID, seal
from hydra_ray.core.settings import Settings
from hydra_ray.core.wire import HEAD_SWEEP_DIR
from hydra_ray.driver.protocol import sweep_dir_on_cluster
from hydra_ray.engine.report import MAX_TABLE_ROWS, summary_table
from hydra_ray.launch.sweep import SweepBook, SweepSettings, batch, sweep_settings

from .conftest import sweep_key_of


def run_batch(
    book: SweepBook,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    run: Callable[[list[Job], int], list[JobOutcome]],
) -> list[JobReturn]:
    """A launch's batch, as the skeleton runs it, with `run` for the launch path."""
    with batch(book, job_overrides, initial_job_idx) as current:
        if current.to_run:
            current.outcomes = run(current.to_run, current.already_done)
    return current.returns


def settings(**keys: Any) -> SweepSettings:
    """The sweep settings of a launcher config with these keys over the face's defaults."""
    defaults = OmegaConf.to_container(OmegaConf.structured(RayLauncherConf))
    assert isinstance(defaults, dict)  # untyped: the checks see the values as given
    return sweep_settings(Settings.of(OmegaConf.create({**defaults, "progress": False, **keys})))


def outcome(
    idx: int,
    overrides: list[str],
    *,
    status: str = SUCCEEDED,
    value: Any = None,
    error: BaseException | None = None,
    attempt: int = 1,
    started: float = 1000.0,
    duration: float = 2.5,
    node: str = "10.0.0.1",
) -> JobOutcome:
    job_return = JobReturn(
        overrides=list(overrides),
        status=JobStatus.COMPLETED if status == SUCCEEDED else JobStatus.FAILED,
    )
    job_return.return_value = value if status == SUCCEEDED else error or ValueError("boom")
    return JobOutcome(
        idx=idx,
        job_return=job_return,
        started=started,
        ended=started + duration,
        node=node,
        attempt=attempt,
        status=status,
    )


def jobs_of(*overrides: str) -> list[Job]:
    return [Job(idx, [ov]) for idx, ov in enumerate(overrides)]


def record_files(sweep_dir: Path) -> list[str]:
    """The files in the record dir, but the sweep's id (core.seal)."""
    return sorted(set(os.listdir(sweep_dir / RECORD_DIR)) - {SWEEP_ID})


def read_summary(sweep_dir: Path) -> dict[str, Any]:
    summary = json.loads((sweep_dir / SUMMARY_FILE).read_text())
    assert isinstance(summary, dict)
    return summary


def files_under(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative name: content): what a step must not change."""
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def strict_json(text: str) -> Any:
    """Parse as strict parsers (jq, JavaScript) do: NaN and Infinity are not JSON."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


class Opaque:
    """A return value that is not JSON."""

    def __repr__(self) -> str:
        return "Opaque(42)"


# ---- Records ----


def test_record_round_trip_keeps_status_attempt_and_return_value(tmp_path: Path) -> None:
    write_record(
        tmp_path, outcome(0, ["x=1"], value={"loss": 0.5}, attempt=3), sweep_key_of(tmp_path)
    )
    write_record(
        tmp_path, outcome(1, ["x=2"], status=FAILED, error=KeyError("lr")), sweep_key_of(tmp_path)
    )

    ok = read_record(tmp_path, 0, sweep_key_of(tmp_path))
    assert ok is not None
    assert (ok.idx, ok.status, ok.attempt) == (0, SUCCEEDED, 3)
    assert ok.job_return.return_value == {"loss": 0.5}
    assert ok.job_return.overrides == ["x=1"]
    assert ok.duration == pytest.approx(2.5)

    failed = read_record(tmp_path, 1, sweep_key_of(tmp_path))
    assert failed is not None
    assert failed.status == FAILED
    assert failed.error == "KeyError: 'lr'"
    assert read_record(tmp_path, 2, sweep_key_of(tmp_path)) is None


def test_empty_record_is_missing_and_the_job_runs_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    SweepBook(tmp_path, ["x=1"], settings()).plan(jobs_of("x=1"))
    record_path(tmp_path, 0).write_bytes(b"")  # renamed into place, then an OS crash

    caplog.set_level(logging.WARNING)
    assert read_record(tmp_path, 0, sweep_key_of(tmp_path)) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(str(record_path(tmp_path, 0)) in w and "job #0 not finished" in w for w in warnings)

    reused, to_run = SweepBook(tmp_path, ["x=1"], settings(resume=True)).plan(jobs_of("x=1"))
    assert reused == []
    assert [j.idx for j in to_run] == [0]


def test_temp_file_of_a_killed_writer_is_not_a_record(tmp_path: Path) -> None:
    import cloudpickle

    record_dir = tmp_path / RECORD_DIR
    record_dir.mkdir()
    # Whole, even: the writer was killed between its write and the rename.
    (record_dir / ".job_3.pkl.k2j4x9").write_bytes(cloudpickle.dumps(outcome(3, ["x=4"])))

    assert read_record(tmp_path, 3, sweep_key_of(tmp_path)) is None
    book = SweepBook(tmp_path, ["x=1,2,3,4"], settings(resume=True))
    reused, to_run = book.plan(jobs_of("x=1", "x=2", "x=3", "x=4"))
    assert reused == []
    assert [j.idx for j in to_run] == [0, 1, 2, 3]


def test_write_record_replaces_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_record(tmp_path, outcome(0, ["x=1"], status=FAILED), sweep_key_of(tmp_path))
    write_record(tmp_path, outcome(0, ["x=1"], value=7, attempt=2), sweep_key_of(tmp_path))

    record = read_record(tmp_path, 0, sweep_key_of(tmp_path))
    assert record is not None
    assert (record.status, record.attempt, record.job_return.return_value) == (SUCCEEDED, 2, 7)
    assert record_files(tmp_path) == ["job_0.pkl"]  # no temp file left

    # A write that fails half way leaves the record as it was, and no temp file.
    def killed(src: str, dst: str) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        write_record(tmp_path, outcome(0, ["x=1"], status=TIMED_OUT), sweep_key_of(tmp_path))
    monkeypatch.undo()

    record = read_record(tmp_path, 0, sweep_key_of(tmp_path))
    assert record is not None
    assert record.status == SUCCEEDED
    assert record_files(tmp_path) == ["job_0.pkl"]


# ---- The resume plan ----


def test_new_sweep_moves_an_earlier_sweeps_records_and_summary_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    jobs = jobs_of("x=1", "x=2")
    overrides = [job.overrides for job in jobs]
    run_batch(SweepBook(tmp_path, ["x=1,2"], settings()), overrides, 0, fake_run(tmp_path, []))
    earlier = files_under(tmp_path / RECORD_DIR) | {
        SUMMARY_FILE: (tmp_path / SUMMARY_FILE).read_bytes()
    }

    caplog.set_level(logging.WARNING)
    reused, to_run = SweepBook(tmp_path, ["x=1,2"], settings(resume=False)).plan(jobs)
    assert reused == []
    assert [j.idx for j in to_run] == [0, 1]
    assert read_record(tmp_path, 0, sweep_key_of(tmp_path)) is None
    assert read_record(tmp_path, 1, sweep_key_of(tmp_path)) is None
    # Not deleted: moved, whole, into a dir of their own, which the log names.
    (aside,) = (tmp_path / RECORD_DIR).glob("earlier-*")
    assert files_under(aside) == earlier
    assert not (tmp_path / SUMMARY_FILE).exists()
    assert any(str(aside) in r.getMessage() for r in caplog.records), caplog.text

    # The new sweep is interrupted before any job ends: a resume runs all of them.
    reused, to_run = SweepBook(tmp_path, ["x=1,2"], settings(resume=True)).plan(jobs)
    assert reused == []
    assert [j.idx for j in to_run] == [0, 1]

    # Starting over again keeps both earlier sweeps, each in its own dir.
    SweepBook(tmp_path, ["x=1,2"], settings(resume=False)).plan(jobs)
    asides = sorted((tmp_path / RECORD_DIR).glob("earlier-*"))
    assert len(asides) == 2 and files_under(aside) == earlier


def test_resume_reuses_succeeded_jobs_and_reruns_the_others(tmp_path: Path) -> None:
    jobs = jobs_of("x=1", "x=2", "x=3", "x=4")
    SweepBook(tmp_path, ["x=1,2,3,4"], settings()).plan(jobs)
    write_record(tmp_path, outcome(0, ["x=1"], value="zero"), sweep_key_of(tmp_path))
    write_record(tmp_path, outcome(1, ["x=2"], status=FAILED), sweep_key_of(tmp_path))
    write_record(tmp_path, outcome(2, ["x=3"], status=TIMED_OUT), sweep_key_of(tmp_path))
    # Job 3 has no record: it never finished.

    book = SweepBook(tmp_path, ["x=1,2,3,4"], settings(resume=True))
    reused, to_run = book.plan(jobs)
    assert [o.idx for o in reused] == [0]
    assert reused[0].resumed is True
    assert reused[0].job_return.return_value == "zero"
    assert [j.idx for j in to_run] == [1, 2, 3]


def test_resume_refuses_another_sweeps_overrides(tmp_path: Path) -> None:
    SweepBook(tmp_path, ["x=1,2"], settings()).plan(jobs_of("x=1", "x=2"))
    write_record(tmp_path, outcome(0, ["x=1"]), sweep_key_of(tmp_path))

    book = SweepBook(tmp_path, ["x=1,3"], settings(resume=True))
    with pytest.raises(ConfigError) as err:
        book.plan(jobs_of("x=1", "x=3"))
    message = str(err.value)
    assert "hydra.launcher.resume=true refused" in message
    assert str(["x=1,2"]) in message
    assert str(["x=1,3"]) in message


def test_resume_accepts_the_same_overrides_in_another_order(tmp_path: Path) -> None:
    jobs = [Job(0, ["x=1", "y=a"]), Job(1, ["x=2", "y=a"])]
    SweepBook(tmp_path, ["x=1,2", "y=a"], settings()).plan(jobs)
    write_record(tmp_path, outcome(0, ["x=1", "y=a"]), sweep_key_of(tmp_path))

    reused, to_run = SweepBook(tmp_path, ["y=a", "x=1,2"], settings(resume=True)).plan(jobs)
    assert [o.idx for o in reused] == [0]
    assert [j.idx for j in to_run] == [1]


def test_resume_refuses_a_job_recorded_with_other_overrides(tmp_path: Path) -> None:
    SweepBook(tmp_path, ["x=1,2"], settings()).plan(jobs_of("x=1", "x=2"))
    write_record(tmp_path, outcome(1, ["x=2"]), sweep_key_of(tmp_path))

    book = SweepBook(tmp_path, ["x=1,2"], settings(resume=True))
    with pytest.raises(ConfigError, match=re.escape("hydra.launcher.resume=true refused")) as err:
        book.plan(jobs_of("x=1", "x=5"))
    assert "job #1" in str(err.value)
    assert str(["x=2"]) in str(err.value)
    assert str(["x=5"]) in str(err.value)


def write_record_of_a_vanished_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Job
) -> str:
    """A record whose return value is of a class from a module that then goes away
    (the resume runs in another environment). Returns why it cannot be read."""
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "vanished_results.py").write_text("class Result:\n    pass\n")
    monkeypatch.syspath_prepend(str(mods))
    module = importlib.import_module("vanished_results")
    write_record(
        tmp_path, outcome(job.idx, job.overrides, value=module.Result()), sweep_key_of(tmp_path)
    )
    shutil.rmtree(mods)
    del sys.modules["vanished_results"]
    importlib.invalidate_caches()
    return "ModuleNotFoundError: No module named 'vanished_results'"


def spoil_record(kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, job: Job) -> str:
    """Leave job's record unusable in the way `kind` says; returns why it is."""
    import cloudpickle

    path = record_path(tmp_path, job.idx)
    if kind == "module gone":
        return write_record_of_a_vanished_module(tmp_path, monkeypatch, job)
    if kind == "truncated":
        write_record(tmp_path, outcome(job.idx, job.overrides, value=1), sweep_key_of(tmp_path))
        path.write_bytes(path.read_bytes()[:80])  # e.g. a disk that filled up
        return "does not verify with this sweep's key"
    if kind == "not an outcome":
        data = cloudpickle.dumps({"idx": job.idx})
        path.write_bytes(seal(sweep_key_of(tmp_path), f"record of job {job.idx}", data))
        return "holds a dict, not a job's outcome"
    if kind == "unsealed":  # an earlier version's, or anybody's who can write there
        path.write_bytes(cloudpickle.dumps(outcome(job.idx, job.overrides, value=1)))
        return "carries no seal of this sweep"
    if kind == "another sweep's":
        other = tmp_path / "other"
        write_record(other, outcome(job.idx, job.overrides, value=1), sweep_key_of(other))
        shutil.copy(record_path(other, job.idx), path)
        return "does not verify with this sweep's key"
    if kind == "another job's record":  # job 3's genuine record, as job 0's
        write_record(tmp_path, outcome(3, ["x=4"], value=1), sweep_key_of(tmp_path))
        shutil.copy(record_path(tmp_path, 3), path)
        return (
            "does not verify with this sweep's key (not written by this sweep's driver as "
            "its record of job 0"
        )
    assert kind == "another job's"
    write_record(tmp_path, outcome(job.idx, ["x=9"], value=9), sweep_key_of(tmp_path))
    return f"a job that succeeded with ['x=9'], but the manifest lists the job with {job.overrides}"


@pytest.mark.parametrize(
    "kind",
    [
        "module gone",
        "truncated",
        "not an outcome",
        "another job's",
        "unsealed",
        "another sweep's",
        "another job's record",
    ],
)
def test_resume_refuses_unreadable_records_naming_them_and_changes_nothing(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = jobs_of("x=1", "x=2", "x=3", "x=4")
    SweepBook(tmp_path, ["x=1,2,3,4"], settings()).plan(jobs)
    why = spoil_record(kind, tmp_path, monkeypatch, jobs[0])
    # A failure (which a rerun would replace), a success, and a second unreadable one.
    write_record(tmp_path, outcome(1, ["x=2"], status=FAILED), sweep_key_of(tmp_path))
    write_record(tmp_path, outcome(2, ["x=3"], value=3), sweep_key_of(tmp_path))
    record_path(tmp_path, 3).write_bytes(b"\x80\x05garbage")
    before = files_under(tmp_path / RECORD_DIR)

    with pytest.raises(ConfigError) as err:
        SweepBook(tmp_path, ["x=1,2,3,4"], settings(resume=True)).plan(jobs)
    message = str(err.value)
    assert message.startswith("hydra.launcher.resume=true refused: 2 job records")
    assert f"\n  {record_path(tmp_path, 0)}: {why}" in message
    assert f"\n  {record_path(tmp_path, 3)}: carries no seal" in message
    assert "job_1.pkl" not in message and "job_2.pkl" not in message
    assert "install that module in this environment" in message
    # Refused before anything changed: no record removed, the manifest as it was.
    assert files_under(tmp_path / RECORD_DIR) == before

    # The message's other fix, as the user would run it: those jobs run again,
    # and their records are kept aside.
    move_aside = message.splitlines()[-1].strip()
    assert move_aside.startswith(f"mkdir -p {tmp_path / RECORD_DIR / 'unreadable'} && mv -n ")
    subprocess.run(move_aside, shell=True, check=True)
    reused, to_run = SweepBook(tmp_path, ["x=1,2,3,4"], settings(resume=True)).plan(jobs)
    assert [o.idx for o in reused] == [2]
    assert [j.idx for j in to_run] == [0, 1, 3]
    aside = files_under(tmp_path / RECORD_DIR / "unreadable")
    assert aside == {name: before[name] for name in ("job_0.pkl", "job_3.pkl")}


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"task_overrides": ["x=1,2"], "jo', "not JSON"),
        ('{"jobs": []}', "not a sweep manifest"),
        ('{"task_overrides": "x", "jobs": {"0": ["x=1"]}}', "not a sweep manifest"),
        ('{"task_overrides": ["x=1,2"], "jobs": []}', "not a sweep manifest"),
        ('{"task_overrides": ["x=1,2"], "jobs": {"first": ["x=1"]}}', "not a sweep manifest"),
        ("[]", "not a sweep manifest"),
    ],
    ids=[
        "truncated",
        "no overrides",
        "overrides a string",
        "jobs a list",
        "a job not a number",
        "a list",
    ],
)
def test_resume_refuses_an_unreadable_manifest_and_keeps_every_record(
    text: str, why: str, tmp_path: Path
) -> None:
    jobs = jobs_of("x=1", "x=2")
    SweepBook(tmp_path, ["x=1,2"], settings()).plan(jobs)
    write_record(tmp_path, outcome(0, ["x=1"], value=0), sweep_key_of(tmp_path))
    write_record(tmp_path, outcome(1, ["x=2"], status=FAILED), sweep_key_of(tmp_path))
    manifest = tmp_path / RECORD_DIR / "sweep.json"
    manifest.write_text(text)
    before = files_under(tmp_path / RECORD_DIR)

    with pytest.raises(ConfigError) as err:
        SweepBook(tmp_path, ["x=1,2"], settings(resume=True)).plan(jobs)
    message = str(err.value)
    assert message.startswith(
        f"hydra.launcher.resume=true refused: the earlier sweep's manifest {manifest} "
        f"cannot be read ({why}"
    )
    assert "hydra.launcher.resume=false" in message and "not deleted" in message
    assert files_under(tmp_path / RECORD_DIR) == before


def test_resume_without_an_earlier_sweep_runs_every_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    reused, to_run = SweepBook(tmp_path, ["x=1,2"], settings(resume=True)).plan(
        jobs_of("x=1", "x=2")
    )
    assert reused == []
    assert [j.idx for j in to_run] == [0, 1]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("holds no earlier sweep" in w for w in warnings), warnings


# ---- One batch ----


FakeRun = Callable[[list[Job], int], list[JobOutcome]]


def fake_run(sweep_dir: Path, calls: list[tuple[list[int], int]]) -> FakeRun:
    """Runs jobs like the engine would: x=3 fails, x=2 returns an Opaque, the
    others their idx; each outcome's record is written as it comes."""

    def run(jobs: list[Job], already_done: int) -> list[JobOutcome]:
        calls.append(([j.idx for j in jobs], already_done))
        outcomes = []
        for job in jobs:
            if job.overrides == ["x=3"]:
                o = outcome(job.idx, job.overrides, status=FAILED, error=ValueError("x is 3"))
            elif job.overrides == ["x=2"]:
                o = outcome(job.idx, job.overrides, value=Opaque(), node="10.0.0.2")
            else:
                o = outcome(job.idx, job.overrides, value=job.idx, attempt=2)
            write_record(sweep_dir, o, sweep_key_of(sweep_dir))
            outcomes.append(o)
        return outcomes

    return run


def test_run_batch_returns_job_returns_in_order_and_writes_the_summary(tmp_path: Path) -> None:
    overrides = [["x=1"], ["x=2"], ["x=3"]]
    calls: list[tuple[list[int], int]] = []
    book = SweepBook(tmp_path, ["x=1,2,3"], settings())

    returns = run_batch(book, overrides, 0, fake_run(tmp_path, calls))

    assert calls == [([0, 1, 2], 0)]
    assert [r.overrides for r in returns] == overrides
    assert [r.status for r in returns] == [JobStatus.COMPLETED] * 2 + [JobStatus.FAILED]
    summary = read_summary(tmp_path)
    assert summary["task_overrides"] == ["x=1,2,3"]
    assert summary["counts"] == {SUCCEEDED: 2, FAILED: 1}
    first, opaque, failed = summary["jobs"]
    assert first == {
        "idx": 0,
        "overrides": ["x=1"],
        "status": SUCCEEDED,
        "resumed": False,
        "attempts": 2,
        "ray_reruns": 0,
        "duration_s": 2.5,
        "started": "1970-01-01T00:16:40+00:00",
        "ended": "1970-01-01T00:16:42+00:00",
        "node": "10.0.0.1",
        "resources": None,
        "output_dir": None,
        "error": None,
        "outputs_left": None,
        "return_value": 0,
    }
    assert opaque["return_value"] == "Opaque(42)"
    assert opaque["node"] == "10.0.0.2"
    assert failed["status"] == FAILED
    assert failed["error"] == "ValueError: x is 3"
    assert failed["return_value"] is None


def test_run_batch_merges_reused_and_new_job_returns(tmp_path: Path) -> None:
    overrides = [["x=1"], ["x=2"], ["x=3"], ["x=4"]]
    calls: list[tuple[list[int], int]] = []
    run_batch(
        SweepBook(tmp_path, ["x=1,2,3,4"], settings()), overrides, 0, fake_run(tmp_path, calls)
    )

    # The resume: x=3 fails again, the others are taken from their records.
    book = SweepBook(tmp_path, ["x=1,2,3,4"], settings(resume=True))
    returns = run_batch(book, overrides, 0, fake_run(tmp_path, calls))

    assert calls[1] == ([2], 3)
    assert [r.overrides for r in returns] == overrides
    assert returns[0].return_value == 0
    assert repr(returns[1].return_value) == "Opaque(42)"
    assert returns[2].status == JobStatus.FAILED
    assert returns[3].return_value == 3
    summary = read_summary(tmp_path)
    assert summary["counts"] == {SUCCEEDED: 3, FAILED: 1}
    assert [j["resumed"] for j in summary["jobs"]] == [True, True, False, True]


def test_interrupted_batch_summarises_what_finished(tmp_path: Path) -> None:
    def run(jobs: list[Job], already_done: int) -> list[JobOutcome]:
        write_record(
            tmp_path, outcome(jobs[0].idx, jobs[0].overrides, value="done"), sweep_key_of(tmp_path)
        )
        raise KeyboardInterrupt  # Ctrl-C while the others run

    book = SweepBook(tmp_path, ["x=1,2,3"], settings())
    with pytest.raises(KeyboardInterrupt):
        run_batch(book, [["x=1"], ["x=2"], ["x=3"]], 5, run)

    summary = read_summary(tmp_path)
    assert summary["counts"] == {SUCCEEDED: 1, INTERRUPTED: 2}
    jobs = summary["jobs"]
    assert [(j["idx"], j["status"]) for j in jobs] == [
        (5, SUCCEEDED),
        (6, INTERRUPTED),
        (7, INTERRUPTED),
    ]
    assert jobs[0]["return_value"] == "done"
    assert jobs[0]["duration_s"] == 2.5
    for job in jobs[1:]:
        assert job["duration_s"] is None
        assert job["started"] is None
        assert job["ended"] is None
        assert job["return_value"] is None
        assert job["error"] is not None and "did not finish" in job["error"]


# ---- Settings ----


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("retries", -1),
        ("retries", 1.5),
        ("job_timeout_s", 0),
        ("job_timeout_s", -2.5),
        ("job_timeout_s", math.nan),  # passes `<= 0`, and would never expire
        ("job_timeout_s", math.inf),
        ("job_timeout_s", -math.inf),
    ],
)
def test_sweep_settings_refuses_invalid_values(key: str, value: float) -> None:
    with pytest.raises(ConfigError, match=re.escape(f"hydra.launcher.{key}={value} is not valid")):
        settings(**{key: value})


def test_sweep_settings_accepts_valid_values() -> None:
    checked = settings(retries=2, job_timeout_s=1.5, resume=True)
    assert checked.policy.retries == 2
    assert checked.policy.job_timeout_s == 1.5
    assert checked.resume is True
    assert checked.policy == Policy(retries=2, job_timeout_s=1.5)
    assert checked.live is False  # progress=false: lines, never the live display


# ---- What the files look like ----


@pytest.mark.parametrize(
    ("umask", "mode"),
    [(0o077, 0o600), (0o027, 0o640), (0o022, 0o644)],
    ids=["umask 077", "umask 027", "umask 022"],
)
def test_the_summary_gets_the_mode_the_umask_gives_records_and_manifest_0600(
    umask: int, mode: int, tmp_path: Path
) -> None:
    old = os.umask(umask)
    try:
        write_manifest(tmp_path, ["x=1"], {0: ["x=1"]})
        write_record(tmp_path, outcome(0, ["x=1"]), sweep_key_of(tmp_path))
        summary = write_summary(tmp_path, ["x=1"], [outcome(0, ["x=1"])])
    finally:
        os.umask(old)
    assert oct(summary.stat().st_mode & 0o777) == oct(mode)
    # They hold the overrides and configs as run, secrets too.
    for path in (tmp_path / RECORD_DIR / "sweep.json", record_path(tmp_path, 0)):
        assert oct(path.stat().st_mode & 0o777) == oct(0o600), path


def test_the_engine_s_default_policy_is_the_launcher_keys_defaults() -> None:
    """An engine run without a launcher (a benchmark, a test) behaves as a
    launcher with no key set: Policy's defaults are the face's."""
    assert settings().policy == Policy()


def test_umask_is_known_where_proc_does_not_tell_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_records, "_PROC_STATUS", "/nonexistent/status")
    _records._umask_set_and_restored.cache_clear()
    old = os.umask(0o027)
    try:
        assert _records._umask() == 0o027
        assert os.umask(0o027) == 0o027  # and left as it was
    finally:
        os.umask(old)
        _records._umask_set_and_restored.cache_clear()


def test_summary_is_strict_json_with_non_finite_numbers_as_strings(tmp_path: Path) -> None:
    loop: list[Any] = []
    loop.append(loop)
    values = [
        math.nan,
        {"loss": math.inf, "curve": [1.5, -math.inf, (math.nan, 2)]},
        {math.nan: 1},  # a key JSON cannot hold: the value's repr
        loop,
    ]
    outcomes = [outcome(i, [f"x={i}"], value=v) for i, v in enumerate(values)]
    path = write_summary(tmp_path, ["x=0,1,2,3"], outcomes)

    jobs = strict_json(path.read_text())["jobs"]
    assert [j["return_value"] for j in jobs] == [
        "NaN",
        {"loss": "Infinity", "curve": [1.5, "-Infinity", ["NaN", 2]]},
        "{nan: 1}",
        "[[...]]",
    ]


# ---- The summary table ----


def table_rows(table: str) -> list[list[str]]:
    """The cells of an ASCII table's body rows."""
    rows = []
    for line in table.splitlines():
        if line.startswith("|") and not set(line) <= set("|+- "):
            rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows[1:]  # after the header


def test_summary_table_off_a_terminal_is_plain_ascii() -> None:
    outcomes = [
        outcome(1, ["x=2"], status=FAILED, error=ValueError("lr too high"), attempt=3),
        outcome(0, ["x=1"], value=1),
    ]
    table = summary_table(outcomes, terminal=False, width=200)

    assert "\x1b" not in table
    assert table.isascii()
    assert {"|", "+", "-"} <= set(table)
    assert table_rows(table) == [
        ["0", "x=1", SUCCEEDED, "2.5 s", "1", "10.0.0.1", ""],
        ["1", "x=2", FAILED, "2.5 s", "3", "10.0.0.1", "ValueError: lr too high"],
    ]


def test_summary_table_of_a_big_sweep_shows_the_jobs_that_did_not_succeed() -> None:
    total = MAX_TABLE_ROWS + 5
    not_ok = {7: FAILED, 42: TIMED_OUT, total - 1: INTERRUPTED}
    outcomes = [
        outcome(i, [f"x={i}"], status=not_ok.get(i, SUCCEEDED), error=RuntimeError(f"e{i}"))
        for i in range(total)
    ]
    table = summary_table(outcomes, terminal=False, width=200)

    assert [row[0] for row in table_rows(table)] == [str(i) for i in sorted(not_ok)]
    assert table.splitlines()[-1] == (
        f"({total - len(not_ok)} succeeded jobs not shown: every job is in sweep_summary.json)"
    )


# ---- Regressions ----


def test_table_cells_are_text_not_markup() -> None:
    jobs = [
        outcome(0, ["tags=[a,b]"], value=1),
        outcome(1, ["x=[/]"], status=FAILED, error=ValueError("bad [red]value[/]")),
    ]
    for terminal in (False, True):
        table = summary_table(jobs, terminal=terminal, width=200)
        assert "tags=[a,b]" in table and "x=[/]" in table
        assert "ValueError: bad [red]value[/]" in table


def test_big_table_counts_what_it_leaves_out() -> None:
    jobs = [outcome(i, [f"x={i}"], status=FAILED) for i in range(MAX_TABLE_ROWS + 50)]
    table = summary_table(jobs, terminal=False, width=200)
    assert table.splitlines()[-1] == "(50 jobs not shown: every job is in sweep_summary.json)"


def test_resume_without_a_manifest_refuses_stray_records_and_keeps_them(tmp_path: Path) -> None:
    write_record(tmp_path, outcome(0, ["y=9"], value="not this job's"), sweep_key_of(tmp_path))
    before = files_under(tmp_path)
    with pytest.raises(ConfigError) as err:
        SweepBook(tmp_path, ["x=1"], settings(resume=True)).plan(jobs_of("x=1"))
    message = str(err.value)
    assert "hydra.launcher.resume=true refused" in message
    assert "job_0.pkl" in message and "no manifest" in message
    assert "hydra.launcher.resume=false" in message
    assert files_under(tmp_path) == before


def test_interrupted_resume_reports_earlier_failures_as_not_finished(tmp_path: Path) -> None:
    SweepBook(tmp_path, ["x=1,2"], settings()).plan(jobs_of("x=1", "x=2"))
    write_record(tmp_path, outcome(0, ["x=1"], value=0), sweep_key_of(tmp_path))
    write_record(
        tmp_path,
        outcome(1, ["x=2"], status=FAILED, error=ValueError("first run")),
        sweep_key_of(tmp_path),
    )

    def run(jobs: list[Job], already_done: int) -> list[JobOutcome]:
        raise KeyboardInterrupt  # before job #1 ran again

    with pytest.raises(KeyboardInterrupt):
        run_batch(SweepBook(tmp_path, ["x=1,2"], settings(resume=True)), [["x=1"], ["x=2"]], 0, run)
    jobs = read_summary(tmp_path)["jobs"]
    assert [(j["status"], j["resumed"]) for j in jobs] == [
        (SUCCEEDED, True),
        (INTERRUPTED, False),
    ]


def test_big_table_of_succeeded_jobs_is_one_line() -> None:
    jobs = [outcome(i, [f"x={i}"]) for i in range(MAX_TABLE_ROWS + 1)]
    table = summary_table(jobs, terminal=False, width=200)
    assert table == (
        f"({MAX_TABLE_ROWS + 1} succeeded jobs not shown: every job is in sweep_summary.json)"
    )


def ran_on_a_cluster(idx: int, output_dir: str, *, chdir: bool = False) -> JobOutcome:
    """A job's outcome as a cluster's driver returns it: Hydra's config of the
    job, with the output dir it had there."""
    done = outcome(idx, [f"x={idx}"], value=idx)
    done.job_return.hydra_cfg = OmegaConf.create(
        {"hydra": {"runtime": {"output_dir": output_dir}, "job": {"chdir": chdir}}}
    )
    for node in (done.job_return.hydra_cfg.hydra, done.job_return.hydra_cfg.hydra.runtime):
        OmegaConf.set_readonly(node, True)  # as Hydra leaves it
        OmegaConf.set_struct(node, True)
    done.job_return.working_dir = output_dir if chdir else "/home/ray/job"
    return done


@pytest.mark.parametrize(
    ("given", "there", "below"),
    [
        # relative: under each node's own working dir (Ray's runtime env dirs)
        ("multirun/d/t", "/tmp/ray/session_1/runtime_resources/_ray_pkg_9/multirun/d/t/3", "3"),
        ("./multirun/d/t", "/home/ray/hydra-ray-x/multirun/d/t/lr=0.1", "lr=0.1"),
        # a sweep dir whose name comes again inside a job's subdir: the last place wins
        ("m", "/w/m/a/m/b", "b"),
        # absolute: the same path on the cluster
        ("/data/sweeps/s1", "/data/sweeps/s1/7", "7"),
    ],
)
def test_a_cluster_job_s_output_dir_becomes_where_its_files_came_home(
    tmp_path: Path, given: str, there: str, below: str
) -> None:
    home = tmp_path / "home"
    moved = _records.moved_home(ran_on_a_cluster(3, there), given, home)
    assert moved.job_return.hydra_cfg is not None
    assert moved.job_return.hydra_cfg.hydra.runtime.output_dir == str(home / below)
    assert moved.job_return.working_dir == "/home/ray/job"  # not the output dir: kept
    assert moved.job_return.return_value == 3


@pytest.mark.parametrize(
    ("sweep_dir", "on_cluster"),
    [
        ("multirun/d/t", "multirun/d/t"),
        ("./out", "out"),
        ("a/../b/", "b"),
        # a path of this machine
        ("/data/sweeps/s1", HEAD_SWEEP_DIR),
        # out of the driver's working dir, into a dir other sweeps share, or
        # the working dir itself, which holds the driver's own files
        ("../out", HEAD_SWEEP_DIR),
        ("a/../../out", HEAD_SWEEP_DIR),
        (".", HEAD_SWEEP_DIR),
        ("a/..", HEAD_SWEEP_DIR),
    ],
)
def test_the_sweep_dir_on_a_cluster_stays_inside_the_driver_s_working_dir(
    sweep_dir: str, on_cluster: str
) -> None:
    assert sweep_dir_on_cluster(sweep_dir) == on_cluster


def test_with_chdir_the_working_dir_comes_home_too_and_a_path_elsewhere_stays(
    tmp_path: Path,
) -> None:
    chdir = _records.moved_home(ran_on_a_cluster(1, "/w/m/1", chdir=True), "m", tmp_path)
    assert chdir.job_return.working_dir == str(tmp_path / "1")
    # Hydra's run_job gives the job's dir as configured: relative with a relative
    # sweep dir (an absolute hydra.sweep.dir is `sweep` on a cluster).
    relative = ran_on_a_cluster(4, "/tmp/ray/_ray_pkg_9/sweep/4", chdir=True)
    relative.job_return.working_dir = "sweep/4"
    moved = _records.moved_home(relative, "sweep", tmp_path)
    assert moved.job_return.working_dir == str(tmp_path / "4")
    elsewhere = ran_on_a_cluster(2, "/scratch/out/2")
    assert _records.moved_home(elsewhere, "m", tmp_path) is elsewhere
    assert _records.moved_home(elsewhere, "/data/m", tmp_path) is elsewhere


def test_records_brought_from_a_cluster_are_rewritten_for_resume_and_summary(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "multirun" / "s"
    for idx in (0, 1):
        write_record(
            sweep, ran_on_a_cluster(idx, f"/tmp/ray/pkg/multirun/s/{idx}"), sweep_key_of(sweep)
        )
    _records.move_records_home(sweep, [0, 1, 5], "multirun/s", sweep, sweep_key_of(sweep))
    for idx in (0, 1):
        record = read_record(sweep, idx, sweep_key_of(sweep))
        assert record is not None and record.job_return.hydra_cfg is not None
        assert record.job_return.hydra_cfg.hydra.runtime.output_dir == str(sweep / str(idx))
    write_summary(
        sweep, [], [r for r in (read_record(sweep, i, sweep_key_of(sweep)) for i in (0, 1)) if r]
    )
    assert [j["output_dir"] for j in read_summary(sweep)["jobs"]] == [
        str(sweep / "0"),
        str(sweep / "1"),
    ]
