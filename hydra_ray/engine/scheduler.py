"""The sweep's scheduler: which jobs are queued, which run, what came back, and
what to do next (submit up to the cap, time out with a grace, run again within
the retries, cancel everything on Ctrl-C). It never touches Ray: a `Backend`
runs the attempts (`engine.run.RayBackend` on a real Ray; the tests' fake runs
them in this process on a fake clock). No Ray here.
"""

import collections
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from hydra_ray.checks.resources import JobResources, request
from hydra_ray.core.errors import JobError, ResourceError, TaskLost
from hydra_ray.core.jobs import FAILED, TIMED_OUT, Job, JobOutcome, JobStarted, Policy
from hydra_ray.core.redact import redacting_logger
from hydra_ray.engine.report import SweepProgress, describe

log = redacting_logger(__name__)


@dataclass
class Attempt:
    """One run of a job: the first, or one its retries allow."""

    job: Job
    number: int
    config: DictConfig | None
    # Its ray.remote() options.
    options: Mapping[str, Any]
    # The clock's time when the job said it started; None while queued.
    started: float | None = None
    # The node it said it runs on (IP, Ray node id), and the job's dir there.
    node: str = "?"
    node_id: str = ""
    job_dir: str | None = None
    # The pid of the worker process it said it runs in.
    pid: int | None = None
    # The clock's time when it was asked to stop (past its timeout); None: not asked.
    stop_asked: float | None = None


class Backend(Protocol):
    """Runs attempts for the scheduler. A handle is whatever `submit` returns."""

    # Whether start events come by `started_events` (polled) rather than first
    # from `next_item`.
    polls: bool

    def submit(self, attempt: Attempt, attempts: int) -> Hashable:
        """Start the attempt (`attempts`: how many runs the job may have)."""

    def wait(self, handles: Sequence[Hashable], timeout: float | None) -> list[Hashable]:
        """Those of `handles` with an item ready, waiting up to `timeout` (None:
        until one is) for the first; with no handles, sleep `timeout`."""

    def next_item(self, handle: Hashable) -> JobStarted | JobOutcome:
        """The next thing the attempt sent: its start, then its outcome; raises
        TaskLost if it ended without one."""

    def ended(self, handle: Hashable) -> bool:
        """Whether the attempt's task has ended, without waiting."""

    def cancel(self, handle: Hashable, *, force: bool) -> None:
        """Stop the attempt: KeyboardInterrupt in the job, or by force."""

    def started_events(self) -> list[JobStarted]:
        """The start events that came since the last call (when `polls`)."""


class Scheduler:
    """Runs every job through `backend`, at most `limit` attempts at a time, in
    job order, and returns their outcomes in job order (`run`).

    A job that fails, times out or whose process dies becomes a failed outcome;
    the others run on. `on_finished` gets each final outcome as it comes: if it
    raises, the error is logged and the sweep goes on. `on_started` gets every
    start event. On KeyboardInterrupt, or any error that ends the run, the jobs
    still queued or running are cancelled before it propagates (Ctrl-C first
    gives the running ones `stop_grace_s` to save their work)."""

    def __init__(
        self,
        backend: Backend,
        jobs: Sequence[Job],
        resources: JobResources,
        *,
        policy: Policy,
        progress: SweepProgress,
        limit: int,
        on_finished: Callable[[JobOutcome], None] | None = None,
        on_started: Callable[[JobStarted], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.jobs = jobs
        self.resources = resources
        self.policy = policy
        self.progress = progress
        self.limit = (
            limit if policy.max_concurrent_jobs is None else min(limit, policy.max_concurrent_jobs)
        )
        self.on_finished = on_finished
        self.on_started = on_started
        self.clock = clock
        self.attempts = policy.retries + 1
        self.queued = collections.deque(jobs)
        # In flight: each attempt by its handle, and by (job, attempt number).
        self.running: dict[Hashable, Attempt] = {}
        self.by_number: dict[tuple[int, int], Attempt] = {}
        self.results: dict[int, JobOutcome] = {}
        # What each job asked for, where it differs per job (the summary shows it).
        self.asked: dict[int, dict[str, float]] = {}

    def run(self) -> list[JobOutcome]:
        try:
            self.top_up()
            while self.running:
                self.turn()
        except BaseException as exc:
            self.cancel_all(exc)
            raise
        return [self.results[job.idx] for job in self.jobs]

    def turn(self) -> None:
        """Wait for what comes next (an item, a deadline), and act on it."""
        # A job asked to stop reads as ready at once, though its next item is
        # not: those are looked at apart, below (_wait_s is 1 s at most then).
        waiting = [h for h, a in self.running.items() if a.stop_asked is None]
        ready = self.backend.wait(waiting, self._wait_s())
        for handle, attempt in list(self.running.items()):
            if attempt.stop_asked is not None and self.backend.ended(handle):
                # It ended after its stop (saved its work, or not): timed out all the same.
                self.settle(handle)
                self.end(attempt, self._timed_out(attempt))
        for event in self.backend.started_events():
            self.started(event)
        for handle in ready:
            self.on_ready(handle)
        self.on_overdue()
        self.top_up()

    def submit(self, attempt: Attempt) -> None:
        handle = self.backend.submit(attempt, self.attempts)
        self.running[handle] = self.by_number[attempt.job.idx, attempt.number] = attempt

    def top_up(self) -> None:
        """Submit queued jobs, in order, up to the cap."""
        while self.queued and len(self.running) < self.limit:
            job = self.queued.popleft()
            try:
                options, config = self.resources.options(job)
            except ResourceError as exc:  # this job's values only: the others run
                self.finish(self._failed(Attempt(job, 1, None, {}), JobError(str(exc)), FAILED))
                continue
            if self.resources.per_job:
                self.asked[job.idx] = request(options)
            self.submit(Attempt(job, 1, config, options))

    def settle(self, handle: Hashable) -> Attempt:
        attempt = self.running.pop(handle)
        del self.by_number[attempt.job.idx, attempt.number]
        return attempt

    def on_ready(self, handle: Hashable) -> None:
        attempt = self.running[handle]
        try:
            item = self.backend.next_item(handle)
        except TaskLost as exc:
            job = attempt.job
            error = JobError(
                f"Job #{job.idx} ({describe(job.overrides) or 'no overrides'}) did not "
                f"complete: {exc}"
            )
            self.settle(handle)
            self.end(attempt, self._failed(attempt, error, FAILED))
            return
        if isinstance(item, JobStarted):
            self.started(item)
            return
        if attempt.pid is not None and (item.node_id, item.pid) != (attempt.node_id, attempt.pid):
            # Another process than the one that started it (a pid of another
            # node may be the same): its first process or node died and Ray ran
            # the task again (its start event is not repeated).
            item.ray_reruns = 1
        self.settle(handle)
        self.end(attempt, item)

    def on_overdue(self) -> None:
        """Stop the attempts past their timeout: first catchably, with a grace
        (stop_grace_s), then by force."""
        policy = self.policy
        now = self.clock()
        overdue = [
            (handle, a)
            for handle, a in self.running.items()
            if (deadline := self._deadline(a)) is not None and now >= deadline
        ]
        for handle, attempt in overdue:
            if attempt.stop_asked is None and policy.stop_grace_s > 0:
                # Its chance to save its work: KeyboardInterrupt in the job.
                self.backend.cancel(handle, force=False)
                attempt.stop_asked = self.clock()
                log.warning(
                    f"#{attempt.job.idx} : {describe(attempt.job.overrides)} ran past "
                    f"hydra.launcher.job_timeout_s={policy.job_timeout_s:g}: stopping it "
                    "(KeyboardInterrupt in the job); cancelled by force in "
                    f"{policy.stop_grace_s:g} s (hydra.launcher.stop_grace_s)"
                )
                continue
            self.backend.cancel(handle, force=True)
            self.settle(handle)
            self.end(attempt, self._timed_out(attempt))

    def started(self, item: JobStarted) -> None:
        if self.on_started is not None:
            self.on_started(item)
        attempt = self.by_number.get((item.idx, item.attempt))
        if attempt is not None:  # (Ray Client: its end may have come first)
            attempt.started, attempt.node = self.clock(), item.node
            attempt.node_id, attempt.job_dir = item.node_id, item.job_dir
            attempt.pid = item.pid
            self.progress.started(item.idx, item.node, item.attempt, self.asked.get(item.idx))

    def end(self, attempt: Attempt, outcome: JobOutcome) -> None:
        """The attempt's outcome: final, or the job runs again (a raise, or a
        timeout with retry_timed_out) while attempts are left."""
        policy = self.policy
        again = outcome.task_raised or (outcome.status == TIMED_OUT and policy.retry_timed_out)
        if again and attempt.number < self.attempts:
            self.progress.retrying(outcome, attempt.number + 1)
            self.submit(Attempt(attempt.job, attempt.number + 1, attempt.config, attempt.options))
        else:
            self.finish(outcome)

    def finish(self, outcome: JobOutcome) -> None:
        outcome.resources = self.asked.get(outcome.idx)
        self.results[outcome.idx] = outcome
        self.progress.finished(outcome)
        if self.on_finished is None:
            return
        try:
            self.on_finished(outcome)
        except Exception as exc:  # any failure of the caller's record: one job's, not the sweep's
            log.error(
                f"Could not record the result of job #{outcome.idx} "
                f"({describe(outcome.job_return.overrides or []) or 'no overrides'}): "
                f"{type(exc).__name__}: {exc}. The sweep goes on with it; "
                "hydra.launcher.resume=true would run this job again"
            )

    def cancel_all(self, exc: BaseException) -> None:
        """No job is left running once the run ends early (Ctrl-C, a bug, a lost
        connection). Ctrl-C first gives the running jobs their chance to save
        their work, as a timeout does."""
        why = "Interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        log.warning(f"{why}: cancelling {len(self.running) + len(self.queued)} unfinished jobs")
        left = list(self.running)
        if isinstance(exc, KeyboardInterrupt) and self.policy.stop_grace_s > 0 and left:
            left = self._stop_gracefully()
        for handle in left:
            self.backend.cancel(handle, force=True)

    def _stop_gracefully(self) -> list[Hashable]:
        """Ask every running job to stop (those asked already, past their
        timeout, keep their own deadline) and wait up to stop_grace_s for them
        to end; another Ctrl-C ends the wait at once. Returns the handles of
        the jobs still running."""
        grace_s = self.policy.stop_grace_s
        deadline = self.clock() + grace_s
        for handle, attempt in self.running.items():
            if attempt.stop_asked is None:
                self.backend.cancel(handle, force=False)
                attempt.stop_asked = self.clock()
            else:
                deadline = max(deadline, attempt.stop_asked + grace_s)
        log.warning(
            f"Asked {len(self.running)} running jobs to stop (KeyboardInterrupt in each, so "
            f"that they can save their work); those still running in {grace_s:g} s "
            "(hydra.launcher.stop_grace_s) are cancelled by force. Ctrl-C again: at once"
        )
        left = list(self.running)
        try:
            while left and self.clock() < deadline:
                left = [handle for handle in left if not self.backend.ended(handle)]
                if left:
                    self.backend.wait([], 0.1)
        except KeyboardInterrupt:
            log.warning(f"Interrupted again: cancelling the {len(left)} running jobs by force")
        return left

    def _wait_s(self) -> float | None:
        """How long to wait for an item: until the next attempt would time out,
        and at most a second when start events are polled or jobs wait for
        their timeout to start counting."""
        if self.policy.job_timeout_s is None:
            return 1.0 if self.backend.polls else None
        now = self.clock()
        deadlines = [d for a in self.running.values() if (d := self._deadline(a)) is not None]
        # Queued jobs start without a ready item: look again within a second.
        return max(0.0, min([*deadlines, now + 1.0]) - now)

    def _deadline(self, attempt: Attempt) -> float | None:
        """When the attempt is to be stopped (past its timeout), or, once asked
        to stop, cancelled by force; None: never (no timeout, or not started)."""
        if self.policy.job_timeout_s is None or attempt.started is None:
            return None
        if attempt.stop_asked is not None:
            return attempt.stop_asked + self.policy.stop_grace_s
        return attempt.started + self.policy.job_timeout_s

    def _timed_out(self, attempt: Attempt) -> JobOutcome:
        job = attempt.job
        error = JobError(
            f"Job #{job.idx} ({describe(job.overrides) or 'no overrides'}) timed out after "
            f"{self.policy.job_timeout_s:g} s (hydra.launcher.job_timeout_s) and was cancelled"
        )
        return self._failed(attempt, error, TIMED_OUT)

    def _failed(self, attempt: Attempt, error: BaseException, status: str) -> JobOutcome:
        job_return = JobReturn(overrides=list(attempt.job.overrides), status=JobStatus.FAILED)
        job_return.return_value = error
        now = time.time()
        ran_s = self.clock() - attempt.started if attempt.started is not None else 0.0
        return JobOutcome(
            idx=attempt.job.idx,
            job_return=job_return,
            started=now - ran_s,
            ended=now,
            node=attempt.node,
            node_id=attempt.node_id,
            job_dir=attempt.job_dir,
            attempt=attempt.number,
            status=status,
        )
