"""One batch of a sweep, around whichever way its jobs run (local engine or the
driver on a cluster's head): decide which jobs run (resume), list them, run
them, then write sweep_summary.json and show the summary table, also when the
run is interrupted. Runs on the user's machine for every launcher. Also the
Session: what a launch path keeps across the sweeper's batches, the launcher's
settings (`core.settings`) among them."""

import dataclasses
import functools
import shlex
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from hydra_ray.checks.resources import for_sweep
from hydra_ray.checks.validate import refuse, settings_problems
from hydra_ray.core.errors import ConfigError, JobError, UnreadableRecord
from hydra_ray.core.jobs import INTERRUPTED, SUCCEEDED, Job, JobOutcome, Policy
from hydra_ray.core.records import (
    EARLIER,
    MANIFEST,
    RECORD_DIR,
    UNREADABLE,
    job_records,
    load_record,
    read_manifest,
    read_record,
    record_path,
    remove_record,
    set_earlier_sweep_aside,
    write_manifest,
    write_summary,
)
from hydra_ray.core.redact import redacting_logger
from hydra_ray.core.seal import sweep_key
from hydra_ray.core.settings import DetachedSettings, Settings
from hydra_ray.driver.protocol import JobSpec, sweep_dir_on_cluster
from hydra_ray.engine.report import describe, summary_table, want_live
from hydra_ray.engine.script import left_out_warning, sent_from
from hydra_ray.engine.worker import ShippedState, capture_sweep_state, composed_here

if TYPE_CHECKING:
    from hydra_ray.infra.autoscaler import ClusterLifetime

log = redacting_logger(__name__)
_S = TypeVar("_S", bound=Settings)


@dataclass(frozen=True)
class SweepSettings:
    """The launcher keys that shape a sweep's run, checked: how its jobs are
    shown and run, and whether it resumes an earlier run."""

    progress: bool
    resume: bool
    policy: Policy

    @property
    def live(self) -> bool:
        return want_live(self.progress)


def task_overrides(config: DictConfig) -> list[str]:
    """The sweep's command-line overrides as typed (`x=${y}` stays text: it is
    the job's config that resolves it)."""
    overrides = OmegaConf.to_container(config.hydra.overrides.task, resolve=False)
    assert isinstance(overrides, list)
    return [str(o) for o in overrides]


def sweep_settings(settings: Settings) -> SweepSettings:
    """The settings, checked (`checks.validate.settings_problems`). Raises ConfigError."""
    refuse(settings_problems(settings))
    return SweepSettings(bool(settings.progress), bool(settings.resume), settings.policy)


class SweepBook:
    """What a launcher keeps across the batches of one multirun: every job's
    outcome so far and the jobs' overrides, in its sweep dir."""

    def resume_hint(self) -> str:
        """The command that continues this sweep, as a user types it."""
        return (
            f"the same command with hydra.sweep.dir={self.sweep_dir.resolve()} "
            "hydra.launcher.resume=true"
        )

    def __init__(self, sweep_dir: Path, task_overrides: Sequence[str], settings: SweepSettings):
        self.sweep_dir = sweep_dir
        self.task_overrides = list(task_overrides)
        self.settings = settings
        self.outcomes: dict[int, JobOutcome] = {}
        # The node each job last said it started on, where the driver sees start
        # events (the `ray` launcher): an interrupted job's row names it.
        self.started_on: dict[int, str] = {}
        self._jobs: dict[int, list[str]] = {}
        self._earlier_jobs: dict[int, list[str]] | None = None
        # The sweep's key (core.seal), once the first batch opened the sweep dir.
        self._key: bytes | None = None

    @property
    def key(self) -> bytes:
        """What seals this sweep's records, returns and packs (see core.seal)."""
        assert self._key is not None, "plan() opens the sweep first"
        return self._key

    def plan(self, jobs: Sequence[Job], *, dry: bool = False) -> tuple[list[JobOutcome], list[Job]]:
        """The outcomes taken from an earlier run of the sweep (resume), and the
        jobs to run now. Raises ConfigError, having changed nothing, if the
        earlier run's files do not fit this sweep or cannot be read. `dry`: only
        read (a dry run): nothing is moved, removed or written."""
        if self._earlier_jobs is None:
            earlier = self._open(dry=dry)
            try:
                self._key = sweep_key(
                    self.sweep_dir / RECORD_DIR, new=not self.settings.resume, write=not dry
                )
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
            if dry:
                return self._planned(jobs, earlier)[:2]
            self._earlier_jobs = earlier
        reused, to_run, stale = self._planned(jobs, self._earlier_jobs)
        for idx in stale:
            remove_record(self.sweep_dir, idx)
        self._jobs.update((job.idx, job.overrides) for job in jobs)
        write_manifest(self.sweep_dir, self.task_overrides, self._jobs)
        return reused, to_run

    def _planned(
        self, jobs: Sequence[Job], earlier_jobs: dict[int, list[str]]
    ) -> tuple[list[JobOutcome], list[Job], list[int]]:
        """The reused outcomes, the jobs to run and the stale failures' numbers."""
        reused: list[JobOutcome] = []
        to_run: list[Job] = []
        stale: list[int] = []
        unusable: list[UnreadableRecord] = []
        for job in jobs:
            earlier = earlier_jobs.get(job.idx)
            if earlier is not None and sorted(earlier) != sorted(job.overrides):
                raise self._refusal(
                    f"its job #{job.idx} had the overrides {earlier}, this run's has "
                    f"{job.overrides}"
                )
            try:
                record = load_record(self.sweep_dir, job.idx, self.key)
            except UnreadableRecord as exc:
                unusable.append(exc)
                continue
            if record is None:
                to_run.append(job)
            elif record.status != SUCCEEDED:
                # A failure is stale once its job runs again: if this run is
                # interrupted, the job is reported as not finished, not as failed.
                stale.append(job.idx)
                to_run.append(job)
            elif earlier is not None and sorted(record.job_return.overrides or []) == sorted(
                job.overrides
            ):
                record.resumed = True
                reused.append(record)
            else:
                # Only records the manifest vouches for, of a job with these overrides.
                vouched = (
                    f"the manifest lists the job with {earlier}"
                    if earlier is not None
                    else "the manifest does not list the job"
                )
                unusable.append(
                    UnreadableRecord(
                        record_path(self.sweep_dir, job.idx),
                        f"a job that succeeded with {record.job_return.overrides}, but {vouched}",
                    )
                )
        if unusable:
            raise self._unusable(unusable)
        return reused, to_run, stale

    def _open(self, *, dry: bool = False) -> dict[int, list[str]]:
        """At the first batch: check the earlier sweep a resume continues, or
        move aside the one a new sweep replaces (`dry`: say so, move nothing)."""
        if not self.settings.resume:
            if dry:
                if job_records(self.sweep_dir) or (self.sweep_dir / RECORD_DIR / MANIFEST).exists():
                    log.warning(
                        f"{self.sweep_dir} holds an earlier sweep's job records: the run "
                        "would move them aside (hydra.launcher.resume=false)"
                    )
                return {}
            aside = set_earlier_sweep_aside(self.sweep_dir)
            if aside is not None:
                log.warning(
                    f"{self.sweep_dir} held an earlier sweep's job records and summary: moved "
                    f"to {aside} (hydra.launcher.resume=false: this sweep starts the dir over)"
                )
            return {}
        try:
            manifest = read_manifest(self.sweep_dir)
        except UnreadableRecord as exc:
            raise ConfigError(
                f"hydra.launcher.resume=true refused: the earlier sweep's manifest {exc.path} "
                f"cannot be read ({exc.why}), so its job records cannot be checked against "
                f"this sweep. Nothing was run or changed. {self._restore_or_start_over()}"
            ) from exc
        if manifest is None:
            records = job_records(self.sweep_dir)
            if records:
                raise ConfigError(
                    f"hydra.launcher.resume=true refused: {self.sweep_dir / RECORD_DIR} holds "
                    f"{len(records)} job records ({', '.join(p.name for p in records[:5])}"
                    f"{', ...' if len(records) > 5 else ''}) but no manifest ({MANIFEST}) "
                    "that says which sweep they are of. Nothing was run or changed. "
                    + self._restore_or_start_over()
                )
            log.warning(
                f"hydra.launcher.resume=true, but {self.sweep_dir} holds no earlier sweep of "
                "this launcher: every job runs"
            )
            return {}
        if sorted(manifest.task_overrides) != sorted(self.task_overrides):
            raise self._refusal(
                f"it was run with {manifest.task_overrides}, this run has {self.task_overrides}"
            )
        if not dry:
            self._jobs = dict(manifest.jobs)
        return dict(manifest.jobs)

    def _restore_or_start_over(self) -> str:
        return (
            f"Restore {self.sweep_dir / RECORD_DIR / MANIFEST} and run the same command "
            "again; or start this dir over with hydra.launcher.resume=false (the earlier "
            f"records are moved to {self.sweep_dir / RECORD_DIR}/{EARLIER}-<time>/, not "
            "deleted); or run the sweep in another hydra.sweep.dir."
        )

    def _unusable(self, problems: list[UnreadableRecord]) -> ConfigError:
        # Absolute: the commands work from wherever the user pastes them.
        aside = self.sweep_dir.resolve() / RECORD_DIR / UNREADABLE
        files = " ".join(shlex.quote(str(p.path.resolve())) for p in problems)
        listed = "".join(f"\n  {p.path.resolve()}: {p.why}" for p in problems)
        records = f"{len(problems)} job record" + ("s" if len(problems) > 1 else "")
        return ConfigError(
            f"hydra.launcher.resume=true refused: {records} of the earlier sweep in "
            f"{self.sweep_dir} cannot be used, and a resume would run again jobs that may "
            f"have finished:{listed}\n"
            "Nothing was run or changed: the files are where they were. Make them readable "
            "here (for a ModuleNotFoundError: install that module in this environment) and "
            "run the same command again. Or, to run those jobs again, move the records aside, "
            f"then run the same command again:\n  mkdir -p {shlex.quote(str(aside))} && "
            f"mv -n {files} {shlex.quote(str(aside))}/"
        )

    def _refusal(self, why: str) -> ConfigError:
        return ConfigError(
            f"hydra.launcher.resume=true refused: the sweep in {self.sweep_dir} is not this "
            f"sweep: {why}. Resume it with the overrides it was run with, or start a new sweep "
            "(another hydra.sweep.dir, or hydra.launcher.resume=false to start this dir over: "
            f"the earlier records are moved to {self.sweep_dir / RECORD_DIR}/{EARLIER}-<time>/)."
        )


@dataclass
class Batch:
    """One launch() of a sweep: its jobs, the ones to run now, and (set by
    the launcher) their outcomes; `returns` once the batch is summarised."""

    jobs: list[Job]
    to_run: list[Job]
    # Jobs of the batch taken from an earlier run (resume): for the progress counts.
    already_done: int
    outcomes: list[JobOutcome] = field(default_factory=list)
    returns: list[JobReturn] = field(default_factory=list)


@contextmanager
def batch(
    book: SweepBook, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Iterator[Batch]:
    """The bookkeeping around running a batch: the plan (resume), the job list
    logged, and after the `with` body has set `outcomes`, the summary and the
    returns in job order. When the body fails or is interrupted, the summary
    still comes (from the records of what finished), then the error goes on; a
    ConfigError (refused before any job ran) goes on alone."""
    jobs = [Job(initial_job_idx + pos, list(ov)) for pos, ov in enumerate(job_overrides)]
    log.info(f"Ray Launcher is launching {len(jobs)} jobs, sweep output dir: {book.sweep_dir}")
    reused, to_run = book.plan(jobs)
    if reused:
        nums = ", ".join(f"#{o.idx}" for o in reused)
        log.info(
            f"Resuming: {len(reused)} of {len(jobs)} jobs succeeded in the earlier run and "
            f"are not run again ({nums}); {len(to_run)} to run"
        )
    for job in to_run:
        log.info(f"\t#{job.idx} : {describe(job.overrides)}")
    book.outcomes.update((o.idx, o) for o in reused)
    current = Batch(jobs=jobs, to_run=to_run, already_done=len(reused))
    try:
        yield current
    except ConfigError:
        raise  # refused before any job ran: nothing to summarise
    except BaseException:
        # What finished has its record (written by the driver that received it).
        for job in to_run:
            book.outcomes[job.idx] = read_record(book.sweep_dir, job.idx, book.key) or _unfinished(
                job, book.started_on.get(job.idx, "")
            )
        _summarise(book, jobs, interrupted=True)
        raise
    book.outcomes.update((o.idx, o) for o in current.outcomes)
    _summarise(book, jobs, interrupted=False)
    current.returns = [book.outcomes[job.idx].job_return for job in jobs]


def _unfinished(job: Job, node: str) -> JobOutcome:
    job_return = JobReturn(overrides=list(job.overrides), status=JobStatus.FAILED)
    job_return.return_value = JobError(f"Job #{job.idx} did not finish: the sweep was stopped")
    return JobOutcome(
        idx=job.idx, job_return=job_return, started=0.0, ended=0.0, node=node, status=INTERRUPTED
    )


def _summarise(book: SweepBook, batch: Sequence[Job], *, interrupted: bool) -> None:
    """sweep_summary.json of every job so far, and the table of this batch's jobs:
    a batched sweeper (Optuna, Ax, max_batch_size) gets one table per batch, not
    the whole sweep again after each (output that grew with the square of the trials)."""
    outcomes = list(book.outcomes.values())
    path = write_summary(book.sweep_dir, book.task_overrides, outcomes)
    shown = [book.outcomes[job.idx] for job in batch]
    terminal = book.settings.live
    width = shutil.get_terminal_size().columns if terminal else 160
    print(summary_table(shown, terminal=terminal, width=width), flush=True)
    if len(outcomes) > len(shown):
        counts = _counts(outcomes)
        log.info(f"The sweep so far: {len(outcomes)} jobs ({counts}); every job is in {path}")
    else:
        log.info(f"Summary of the sweep's {len(outcomes)} jobs: {path}")
    not_done = [o.idx for o in shown if o.status != SUCCEEDED]
    if interrupted or not_done:
        again = "the jobs that did not succeed" if not interrupted else "the rest of the sweep"
        log.warning(
            f"To run {again}: run {book.resume_hint()} (records in {book.sweep_dir / RECORD_DIR})"
        )
    sys.stdout.flush()


def _counts(outcomes: Sequence[JobOutcome]) -> str:
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))


@dataclass
class Session:
    """What a launch path gets from the launcher Hydra made: Hydra's context, the
    app, the multirun's config, and what the sweep keeps across the sweeper's
    batches. Each launch path fills the fields it uses; none sees a Launcher."""

    hydra_context: HydraContext
    task_function: TaskFunction
    config: DictConfig
    # The sweep's jobs and outcomes across batches (summary, resume): made at the
    # first launch().
    book: "SweepBook | None" = None
    # `ray`: the sweep state in Ray's object store, shipped at the first launch()
    # and reused by the next batches while the Ray connection lives.
    shipped: ShippedState | None = None
    # `ray_aws`/`ray_cluster`: the multirun's one cluster, made at the first launch().
    lifetime: "ClusterLifetime | None" = None

    @functools.cached_property
    def settings(self) -> Settings:
        """hydra.launcher, read once (the skeleton reads it first). Raises ConfigError."""
        return Settings.of(self.config.hydra.launcher)

    def settings_as(self, kind: type[_S]) -> _S:
        """The settings, of the kind its launch path's launchers have."""
        settings = self.settings
        assert isinstance(settings, kind), type(settings)
        return settings


def warn_if_script_left_out(spec: JobSpec, staged: Path) -> None:
    """Say what fails on the cluster if the code sync_up sends (as staged to send,
    in `staged`) lacks the app's script."""
    warning = left_out_warning(spec.state.script, staged if spec.code_dir is not None else None)
    if warning is not None:
        log.warning(warning)


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
    state = capture_sweep_state(context, session.task_function, config)
    settings = session.settings_as(DetachedSettings)
    source_dir = settings.sync_up.source_dir
    if state.script is not None and code_dir is not None and source_dir is not None:
        script = sent_from(state.script, source_dir, str(config.hydra.runtime.cwd))
        state = dataclasses.replace(state, script=script)
    # An absolute sweep dir is a path of this machine: on the cluster it lives in
    # the driver's working dir, as a relative one does, and comes home.
    there = sweep_dir_on_cluster(str(book.sweep_dir))
    if there != str(book.sweep_dir):
        state = dataclasses.replace(state, sweep_dir=there)
    return JobSpec(
        state=state,
        jobs=current.to_run,
        configs=configs,
        init=settings.ray_init,
        sweep_dir=there,
        code_dir=code_dir,
        policy=book.settings.policy,
        live=book.settings.live,
        width=shutil.get_terminal_size().columns if book.settings.live else None,
        already_done=current.already_done,
        key=book.key,
    )
