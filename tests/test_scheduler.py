"""The scheduler's decisions, on a fake backend in this process with a fake
clock (no Ray, no sleeping): the cap, timeouts with their grace, retries, the
retry of timed-out jobs, reruns by Ray, a lost task, a job whose values do not
resolve, a failing record, and Ctrl-C. The same behaviour on a real Ray is
tested in test_engine.py, test_long_sweeps.py and test_ray_launcher.py."""

import logging
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from hydra_ray.checks.resources import JobResources
from hydra_ray.core.errors import TaskLost
from hydra_ray.core.jobs import FAILED, SUCCEEDED, TIMED_OUT, Job, JobOutcome, JobStarted, Policy
from hydra_ray.engine.report import SweepProgress
from hydra_ray.engine.scheduler import Attempt, Scheduler


@dataclass
class Plan:
    """How one attempt of a job behaves, in fake seconds."""

    runs_s: float = 1.0
    raises: bool = False
    # Ends without an outcome (its process died), with this reason.
    lost: str | None = None
    # Ends this long after a catchable stop (KeyboardInterrupt); None: never.
    saves_s: float | None = 0.5
    # Its outcome comes from this process (node id, pid) rather than the one that
    # started it (Ray ran it again after the first died).
    ends_in: tuple[str, int] | None = None


@dataclass
class Run:
    attempt: Attempt
    plan: Plan
    submitted: float
    pid: int
    start_sent: bool = False
    outcome_read: bool = False
    stop_asked: float | None = None
    forced: bool = False

    def ends_at(self) -> float:
        return self.submitted + self.plan.runs_s


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class FakeBackend:
    """Runs each attempt as its Plan says, on the fake clock: it starts when
    submitted, ends `runs_s` later. `interrupt_at`: a KeyboardInterrupt comes
    out of the first wait at or after that time."""

    clock: FakeClock
    plan: Callable[[int, int], Plan] = lambda idx, number: Plan()
    interrupt_at: float | None = None
    polls: bool = False
    runs: dict[int, Run] = field(default_factory=dict)
    peak: int = 0
    cancels: list[tuple[int, int, bool]] = field(default_factory=list)

    def submit(self, attempt: Attempt, attempts: int) -> Hashable:
        handle = len(self.runs)
        plan = self.plan(attempt.job.idx, attempt.number)
        self.runs[handle] = Run(attempt, plan, self.clock.now, pid=1000 + handle)
        self.peak = max(self.peak, sum(not self.ended(h) for h in self.runs))
        return handle

    def _ready_at(self, handle: Hashable) -> float:
        run = self.runs[int(str(handle))]
        return run.submitted if not (run.start_sent or self.polls) else run.ends_at()

    def wait(self, handles: Sequence[Hashable], timeout: float | None) -> list[Hashable]:
        if self.interrupt_at is not None and self.clock.now >= self.interrupt_at:
            self.interrupt_at = None
            raise KeyboardInterrupt
        times = [self._ready_at(h) for h in handles]
        until = min(times, default=float("inf"))
        if timeout is not None:
            until = min(until, self.clock.now + timeout)
        if self.interrupt_at is not None:
            until = min(until, self.interrupt_at)
        assert until != float("inf"), "the scheduler waits for nothing, forever"
        self.clock.now = max(self.clock.now, until)
        return [h for h, t in zip(handles, times, strict=True) if t <= self.clock.now]

    def next_item(self, handle: Hashable) -> JobStarted | JobOutcome:
        run = self.runs[int(str(handle))]
        job = run.attempt.job
        if not run.start_sent and not self.polls:
            run.start_sent = True
            return self._start_of(run)
        run.outcome_read = True
        if run.plan.lost is not None:
            raise TaskLost(run.plan.lost)
        status = JobStatus.FAILED if run.plan.raises else JobStatus.COMPLETED
        job_return = JobReturn(overrides=job.overrides, status=status)
        job_return.return_value = ValueError("boom") if run.plan.raises else job.idx
        return JobOutcome(
            idx=job.idx,
            job_return=job_return,
            started=run.submitted,
            ended=self.clock.now,
            node="10.0.0.1",
            node_id=run.plan.ends_in[0] if run.plan.ends_in else "node-a",
            pid=run.plan.ends_in[1] if run.plan.ends_in else run.pid,
            attempt=run.attempt.number,
            task_raised=run.plan.raises,
            status=FAILED if run.plan.raises else SUCCEEDED,
        )

    def ended(self, handle: Hashable) -> bool:
        run = self.runs[int(str(handle))]
        if run.forced or run.outcome_read:
            return True
        if run.stop_asked is not None and run.plan.saves_s is not None:
            return self.clock.now >= run.stop_asked + run.plan.saves_s
        return False

    def cancel(self, handle: Hashable, *, force: bool) -> None:
        run = self.runs[int(str(handle))]
        self.cancels.append((run.attempt.job.idx, run.attempt.number, force))
        if force:
            run.forced = True
        elif run.stop_asked is None:
            run.stop_asked = self.clock.now

    def started_events(self) -> list[JobStarted]:
        """(As Ray Client's start board: the starts of the attempts running.)"""
        if not self.polls:
            return []
        starting = [r for r in self.runs.values() if not r.start_sent]
        for run in starting:
            run.start_sent = True
        return [self._start_of(run) for run in starting]

    @staticmethod
    def _start_of(run: Run) -> JobStarted:
        attempt = run.attempt
        return JobStarted(attempt.job.idx, attempt.number, "10.0.0.1", run.pid, "node-a", "/d")


def _jobs(n: int) -> list[Job]:
    return [Job(idx, [f"x={idx}"]) for idx in range(n)]


def _resources() -> JobResources:
    config = OmegaConf.create({"hydra": {"launcher": {"ray": {"remote": {"num_cpus": 1}}}}})
    return JobResources(config, compose=lambda overrides: OmegaConf.create({"x": overrides}))


def _run(
    backend: FakeBackend,
    jobs: Sequence[Job],
    policy: Policy,
    *,
    resources: JobResources | None = None,
    limit: int = 200,
    on_finished: Callable[[JobOutcome], None] | None = None,
) -> list[JobOutcome]:
    with SweepProgress([(j.idx, j.overrides) for j in jobs], live=False) as progress:
        return Scheduler(
            backend,
            jobs,
            resources or _resources(),
            policy=policy,
            progress=progress,
            limit=limit,
            on_finished=on_finished,
            clock=backend.clock,
        ).run()


def test_every_job_runs_once_and_the_outcomes_come_in_job_order() -> None:
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(runs_s=5.0 - idx))
    outcomes = _run(backend, _jobs(5), Policy())
    assert [o.idx for o in outcomes] == [0, 1, 2, 3, 4]
    assert [o.status for o in outcomes] == [SUCCEEDED] * 5
    assert len(backend.runs) == 5 and backend.cancels == []
    assert backend.peak == 5  # all at once: no cap asked for


@pytest.mark.parametrize("cap, limit, peak", [(2, 200, 2), (None, 3, 3), (5, 3, 3)])
def test_no_more_attempts_run_at_once_than_the_cap_or_the_in_flight_limit(
    cap: int | None, limit: int, peak: int
) -> None:
    backend = FakeBackend(FakeClock())
    outcomes = _run(backend, _jobs(7), Policy(max_concurrent_jobs=cap), limit=limit)
    assert backend.peak == peak
    assert [o.status for o in outcomes] == [SUCCEEDED] * 7
    # In job order: each submitted once, none skipped.
    assert [r.attempt.job.idx for r in backend.runs.values()] == list(range(7))


def test_a_job_past_its_timeout_is_asked_to_stop_then_cancelled_by_force_after_the_grace() -> None:
    plans = {1: Plan(runs_s=100.0, saves_s=None)}  # ignores the catchable stop
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: plans.get(idx, Plan()))
    outcomes = _run(backend, _jobs(3), Policy(job_timeout_s=10.0, stop_grace_s=4.0))
    assert [o.status for o in outcomes] == [SUCCEEDED, TIMED_OUT, SUCCEEDED]
    assert backend.cancels == [(1, 1, False), (1, 1, True)]
    assert "timed out after 10 s (hydra.launcher.job_timeout_s)" in str(outcomes[1].error)
    assert backend.clock.now == pytest.approx(14.0, abs=1.0)  # its timeout plus the grace


def test_a_job_that_ends_within_its_grace_is_timed_out_and_not_cancelled_by_force() -> None:
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(runs_s=100.0, saves_s=1.0))
    outcomes = _run(backend, _jobs(1), Policy(job_timeout_s=10.0, stop_grace_s=4.0))
    assert [o.status for o in outcomes] == [TIMED_OUT]
    assert backend.cancels == [(0, 1, False)]
    assert backend.clock.now < 14.0


def test_with_no_grace_a_job_past_its_timeout_is_cancelled_by_force_at_once() -> None:
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(runs_s=100.0))
    outcomes = _run(backend, _jobs(1), Policy(job_timeout_s=10.0, stop_grace_s=0))
    assert [o.status for o in outcomes] == [TIMED_OUT]
    assert backend.cancels == [(0, 1, True)]


def test_a_job_that_raises_runs_again_within_its_retries_and_its_success_counts() -> None:
    # Job 0 raises on its first two attempts; job 1 raises on every one.
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(raises=idx == 1 or n < 3))
    outcomes = _run(backend, _jobs(2), Policy(retries=2))
    assert [(o.status, o.attempt) for o in outcomes] == [(SUCCEEDED, 3), (FAILED, 3)]
    assert [(r.attempt.job.idx, r.attempt.number) for r in backend.runs.values()] == [
        (0, 1),
        (1, 1),
        (0, 2),
        (1, 2),
        (0, 3),
        (1, 3),
    ]


def test_a_timed_out_job_runs_again_only_with_retry_timed_out() -> None:
    def plan(idx: int, number: int) -> Plan:
        return Plan(runs_s=100.0 if number == 1 else 1.0)

    for retry, expected in ((False, (TIMED_OUT, 1)), (True, (SUCCEEDED, 2))):
        backend = FakeBackend(FakeClock(), plan=plan)
        policy = Policy(retries=1, job_timeout_s=10.0, stop_grace_s=1.0, retry_timed_out=retry)
        outcomes = _run(backend, _jobs(1), policy)
        assert [(o.status, o.attempt) for o in outcomes] == [expected]


@pytest.mark.parametrize(
    ("ends_in", "reruns"),
    [
        (("node-a", 1000), 0),  # where it started (the fake's first pid is 1000)
        # Ray ran it again after its first process died: another pid, or the
        # same pid on another node (each node counts its own).
        (("node-a", 4343), 1),
        (("node-b", 1000), 1),
    ],
)
def test_an_outcome_from_another_process_than_the_start_counts_a_ray_rerun(
    ends_in: tuple[str, int], reruns: int
) -> None:
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(ends_in=ends_in))
    outcomes = _run(backend, _jobs(1), Policy())
    assert [o.ray_reruns for o in outcomes] == [reruns]


def test_a_task_lost_without_an_outcome_fails_its_job_alone_and_is_not_retried() -> None:
    lost = "WorkerCrashedError: The worker died unexpectedly"
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(lost=lost if idx == 1 else None))
    outcomes = _run(backend, _jobs(3), Policy(retries=2))
    assert [o.status for o in outcomes] == [SUCCEEDED, FAILED, SUCCEEDED]
    assert f"Job #1 (x=1) did not complete: {lost}" in str(outcomes[1].error)
    assert outcomes[1].ray_reruns == 0
    assert len(backend.runs) == 3


def test_a_job_whose_values_do_not_resolve_fails_alone_and_is_never_submitted() -> None:
    def compose(overrides: Sequence[str]) -> DictConfig:
        if overrides == ["x=1"]:
            raise ValueError("no such key")
        return OmegaConf.create({"cpus": 1, **_per_job("${cpus}")})

    resources = JobResources(OmegaConf.create(_per_job("${cpus}")), compose=compose)
    backend = FakeBackend(FakeClock())
    outcomes = _run(backend, _jobs(3), Policy(), resources=resources)
    assert [o.status for o in outcomes] == [SUCCEEDED, FAILED, SUCCEEDED]
    assert "Job #1 (x=1): its config could not be composed" in str(outcomes[1].error)
    assert [r.attempt.job.idx for r in backend.runs.values()] == [0, 2]
    assert [o.resources for o in outcomes] == [{"CPU": 1}, None, {"CPU": 1}]


def _per_job(cpus: str) -> dict[str, Any]:
    return {"hydra": {"runtime": {"cwd": "/"}, "launcher": {"ray": {"remote": {"num_cpus": cpus}}}}}


def test_a_record_that_cannot_be_written_is_logged_and_the_sweep_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def on_finished(outcome: JobOutcome) -> None:
        if outcome.idx == 0:
            raise OSError("No space left on device")

    backend = FakeBackend(FakeClock())
    with caplog.at_level(logging.ERROR):
        outcomes = _run(backend, _jobs(2), Policy(), on_finished=on_finished)
    assert [o.status for o in outcomes] == [SUCCEEDED, SUCCEEDED]
    assert "Could not record the result of job #0 (x=0): OSError" in caplog.text


def test_ctrl_c_asks_the_running_jobs_to_stop_forces_the_rest_and_submits_no_more() -> None:
    # Job 0 saves its work within the grace; job 1 never does; jobs 2-3 wait for the cap.
    plans = {0: Plan(runs_s=100.0, saves_s=1.0), 1: Plan(runs_s=100.0, saves_s=None)}
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: plans[idx], interrupt_at=5.0)
    with pytest.raises(KeyboardInterrupt):
        _run(backend, _jobs(4), Policy(max_concurrent_jobs=2, stop_grace_s=3.0))
    assert backend.cancels == [(0, 1, False), (1, 1, False), (1, 1, True)]
    assert len(backend.runs) == 2  # the queued jobs never ran
    assert backend.clock.now == pytest.approx(8.0, abs=0.2)  # Ctrl-C plus the grace


def test_an_error_that_ends_the_run_cancels_every_running_job_by_force_at_once() -> None:
    class Broken(FakeBackend):
        def started_events(self) -> list[JobStarted]:
            if self.clock.now >= 3.0:
                raise ConnectionError("lost the cluster")
            return []

    backend = Broken(FakeClock(), plan=lambda idx, n: Plan(runs_s=100.0))
    with pytest.raises(ConnectionError):
        _run(backend, _jobs(2), Policy(job_timeout_s=50.0, stop_grace_s=5.0))
    assert sorted(backend.cancels) == [(0, 1, True), (1, 1, True)]


def test_with_start_events_polled_as_under_ray_client_timeouts_and_outcomes_are_the_same() -> None:
    plans = {1: Plan(runs_s=100.0, saves_s=None), 2: Plan(runs_s=0.2)}
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: plans.get(idx, Plan()), polls=True)
    policy = Policy(job_timeout_s=10.0, stop_grace_s=2.0)
    outcomes = _run(backend, _jobs(3), policy)
    assert [o.status for o in outcomes] == [SUCCEEDED, TIMED_OUT, SUCCEEDED]
    assert backend.cancels == [(1, 1, False), (1, 1, True)]
    # The timeout counted from the start the board reported (a poll waits a second at most).
    assert backend.clock.now == pytest.approx(12.0, abs=1.0)
    # Without a timeout, a polled start still gets the scheduler out of its wait.
    backend = FakeBackend(FakeClock(), plan=lambda idx, n: Plan(runs_s=3.0), polls=True)
    assert [o.status for o in _run(backend, _jobs(2), Policy())] == [SUCCEEDED] * 2
