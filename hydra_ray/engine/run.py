"""The execution engine: run a batch of sweep jobs as Ray tasks on the Ray this
process is connected to, and gather their `JobReturn`s.

Used unchanged by the local launcher and by the driver that runs on a cluster's
head. Imported when a sweep launches, not at Hydra's plugin scan (which skips
modules named `_*`).
"""

import collections
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from hydra_ray.checks.resources import JobResources, request
from hydra_ray.checks.validate import without_nulls
from hydra_ray.core.errors import JobError, ResourceError
from hydra_ray.core.jobs import FAILED, TIMED_OUT, Job, JobOutcome, JobStarted, Policy
from hydra_ray.core.records import write_record
from hydra_ray.core.redact import redacting_logger
from hydra_ray.engine.gather import JobDirs
from hydra_ray.engine.report import SweepProgress, describe
from hydra_ray.engine.worker import ShippedState, run_one_job, run_one_job_reporting

log = redacting_logger(__name__)


@dataclass
class _Attempt:
    job: Job
    number: int
    config: DictConfig | None
    # Its ray.remote() options (without num_returns).
    options: Mapping[str, Any]
    # time.monotonic() of this driver when the job said it started; None while queued.
    started: float | None = None
    # The node it said it runs on (IP, Ray node id), and the job's dir there.
    node: str = "?"
    node_id: str = ""
    job_dir: str | None = None
    # The pid of the worker process it said it runs in.
    pid: int | None = None
    # time.monotonic() when it was asked to stop (past its timeout); None: not asked.
    stop_asked: float | None = None


def run_batch_here(
    shipped: ShippedState,
    jobs: Sequence[Job],
    resources: JobResources,
    *,
    policy: Policy,
    sweep_dir: Path,
    live: bool,
    already_done: int,
    gather: Callable[[JobDirs], None],
    key: bytes,
    width: int | None = None,
    on_started: Callable[[JobStarted], None] | None = None,
) -> list[JobOutcome]:
    """Run a batch on the Ray this process is connected to, as both the local
    launcher and the cluster's head driver do: the progress display, the jobs,
    each job's record written as its result arrives, and then, also after a
    failure or Ctrl-C, `gather(job dirs)`: what the started jobs wrote on other
    nodes is brought to this one. `key`: the sweep's, that seals the records."""
    job_dirs = JobDirs()

    def started(event: JobStarted) -> None:
        job_dirs.job_started(event)
        if on_started is not None:
            on_started(event)

    def finished(outcome: JobOutcome) -> None:
        job_dirs.job_finished(outcome)
        write_record(sweep_dir, outcome, key)

    try:
        with SweepProgress(
            [(j.idx, j.overrides) for j in jobs],
            live=live,
            width=width,
            already_done=already_done,
        ) as progress:
            return run_jobs(
                shipped,
                jobs,
                resources,
                policy=policy,
                progress=progress,
                on_finished=finished,
                on_started=started,
            )
    finally:
        gather(job_dirs)


def run_jobs(
    shipped: ShippedState,
    jobs: Sequence[Job],
    resources: JobResources,
    *,
    policy: Policy,
    progress: SweepProgress,
    on_finished: Callable[[JobOutcome], None] | None = None,
    on_started: Callable[[JobStarted], None] | None = None,
) -> list[JobOutcome]:
    """Run every job as a Ray task, concurrently, and return their outcomes in
    job order. Each job asks Ray for what `resources` gives it; its config is
    composed in its worker, unless `resources` composed it already (for its
    options, or on a machine that has the app's config files).

    A job that fails, times out or whose process dies becomes a failed outcome;
    the others run on. `on_finished` is called with each final outcome as it
    comes (the sweep's records): if it raises, the error is logged and the
    sweep goes on. `on_started` is called with every start event (where each
    attempt writes: the gather). On KeyboardInterrupt, or any error that ends
    the run, the jobs still queued or running are cancelled before it
    propagates."""
    import ray

    # Ray Client (`ray://` addresses) has no streaming generators: there, jobs are
    # plain tasks that tell a small actor when they start.
    board: Any = ray.remote(num_cpus=0)(StartBoard).remote() if _ray_client() else None
    if board is None:
        streaming: dict[str, Any] = {"num_returns": "streaming"}
        task = ray.remote(run_one_job)
    else:
        streaming = {}
        task = ray.remote(run_one_job_reporting)
    attempts = policy.retries + 1
    # What each job asked for, where it differs per job (the summary shows it).
    asked: dict[int, dict[str, float]] = {}
    # In flight: each attempt by its task's ref, and by (job, attempt number).
    running: dict[Any, _Attempt] = {}
    by_number: dict[tuple[int, int], _Attempt] = {}
    queued = collections.deque(jobs)
    limit = in_flight_limit()
    if policy.max_concurrent_jobs is not None:
        # Ray runs what it is given: the jobs past the cap wait here, in order.
        limit = min(limit, policy.max_concurrent_jobs)

    def submit(attempt: _Attempt) -> None:
        job, config = attempt.job, attempt.config
        args = (
            shipped.key,
            [shipped.ref],
            job.idx,
            job.overrides,
            config,
            attempt.number,
            attempts,
        )
        named = task.options(**attempt.options, **streaming, name=f"hydra job #{job.idx}")
        ref = named.remote(*args) if board is None else named.remote(board, *args)
        running[ref] = by_number[job.idx, attempt.number] = attempt

    def top_up() -> None:
        while queued and len(running) < limit:
            job = queued.popleft()
            try:
                options, config = resources.options(job)
            except ResourceError as exc:  # this job's values only: the others run
                finish(_failed(_Attempt(job, 1, None, {}), JobError(str(exc)), FAILED))
                continue
            if resources.per_job:
                asked[job.idx] = request(options)
            submit(_Attempt(job, 1, config, options))

    def settled(ref: Any) -> _Attempt:
        attempt = running.pop(ref)
        del by_number[attempt.job.idx, attempt.number]
        return attempt

    results: dict[int, JobOutcome] = {}

    def finish(outcome: JobOutcome) -> None:
        outcome.resources = asked.get(outcome.idx)
        results[outcome.idx] = outcome
        progress.finished(outcome)
        if on_finished is None:
            return
        try:
            on_finished(outcome)
        except Exception as exc:  # any failure of the caller's record: one job's, not the sweep's
            log.error(
                f"Could not record the result of job #{outcome.idx} "
                f"({describe(outcome.job_return.overrides or []) or 'no overrides'}): "
                f"{type(exc).__name__}: {exc}. The sweep goes on with it; "
                "hydra.launcher.resume=true would run this job again"
            )

    def end(attempt: _Attempt, outcome: JobOutcome) -> None:
        """The attempt's outcome: final, or the job runs again (a raise, or a
        timeout with retry_timed_out) while attempts are left."""
        again = outcome.task_raised or (outcome.status == TIMED_OUT and policy.retry_timed_out)
        if again and attempt.number < attempts:
            progress.retrying(outcome, attempt.number + 1)
            submit(_Attempt(attempt.job, attempt.number + 1, attempt.config, attempt.options))
        else:
            finish(outcome)

    def started(item: JobStarted) -> None:
        if on_started is not None:
            on_started(item)
        attempt = by_number.get((item.idx, item.attempt))
        if attempt is not None:  # (Ray Client: its end may have come first)
            attempt.started, attempt.node = time.monotonic(), item.node
            attempt.node_id, attempt.job_dir = item.node_id, item.job_dir
            attempt.pid = item.pid
            progress.started(item.idx, item.node, item.attempt, asked.get(item.idx))

    try:
        top_up()
        while running:
            wait_s = _wait_s(running, policy, poll=board is not None)
            # A job asked to stop reads as ready to ray.wait at once, though its
            # next item is not: those are polled apart, below (_wait_s is 1 s at most).
            waiting = [ref for ref, a in running.items() if a.stop_asked is None]
            ready: list[Any] = []
            if waiting:
                ready, _ = ray.wait(waiting, num_returns=1, timeout=wait_s)
                if ready and len(waiting) > 1:  # all else that is ready, without waiting
                    ready, _ = ray.wait(waiting, num_returns=len(waiting), timeout=0)
            elif wait_s:
                time.sleep(wait_s)
            for ref, attempt in list(running.items()):
                if attempt.stop_asked is not None and _ended(ref):
                    # It ended after its stop (saved its work, or not): timed out all the same.
                    settled(ref)
                    end(attempt, _timed_out(attempt, policy))
            if board is not None:
                for event in ray.get(board.drain.remote()):
                    started(event)
            for ref in ready:
                attempt = running[ref]
                item = _next_item(ref, attempt)
                if isinstance(item, JobStarted):
                    started(item)
                    continue
                settled(ref)
                end(attempt, item)
            for ref, attempt in list(_overdue(running, policy)):
                if attempt.stop_asked is None and policy.stop_grace_s > 0:
                    # Its chance to save its work: KeyboardInterrupt in the job.
                    ray.cancel(ref, force=False)
                    attempt.stop_asked = time.monotonic()
                    log.warning(
                        f"#{attempt.job.idx} : {describe(attempt.job.overrides)} ran past "
                        f"hydra.launcher.job_timeout_s={policy.job_timeout_s:g}: stopping it "
                        "(KeyboardInterrupt in the job); cancelled by force in "
                        f"{policy.stop_grace_s:g} s (hydra.launcher.stop_grace_s)"
                    )
                    continue
                ray.cancel(ref, force=True)
                settled(ref)
                end(attempt, _timed_out(attempt, policy))
            top_up()
    except BaseException as exc:
        # Whatever ends the run early (Ctrl-C, a bug, a lost connection), no job
        # is left running on the cluster. Ctrl-C first gives the running jobs
        # their chance to save their work, as a timeout does.
        why = "Interrupted" if isinstance(exc, KeyboardInterrupt) else type(exc).__name__
        log.warning(f"{why}: cancelling {len(running) + len(queued)} unfinished jobs")
        left = list(running)
        if isinstance(exc, KeyboardInterrupt) and policy.stop_grace_s > 0 and left:
            left = _stop_gracefully(running, policy.stop_grace_s)
        for ref in left:
            ray.cancel(ref, force=True)
        raise
    finally:
        if board is not None:
            ray.kill(board)
    return [results[job.idx] for job in jobs]


# At most this many attempts are submitted to Ray at a time (or twice the
# cluster's CPUs, if more); the rest wait here, in order (Ray's "limit pending
# tasks" pattern). Each turn of the loop, a ray.wait over what is in flight,
# then costs the same whether the sweep has 20 jobs or 10,000, and a big
# cluster still has work for every CPU and its autoscaler sees the demand
# (which doubles as the cluster grows). Not more: each turn costs in
# proportion to what is in flight (about 1 ms at 1,000, two turns a job).
IN_FLIGHT_MIN = 200


def in_flight_limit() -> int:
    import ray

    cpus = ray.cluster_resources().get("CPU", 0)  # type: ignore[no-untyped-call]
    return max(IN_FLIGHT_MIN, 2 * int(cpus))


class StartBoard:
    """Collects the start events of jobs run as plain tasks (Ray Client)."""

    def __init__(self) -> None:
        self._events: list[JobStarted] = []

    def started(self, event: JobStarted) -> None:
        self._events.append(event)

    def drain(self) -> list[JobStarted]:
        events, self._events = self._events, []
        return events


def unschedulable(remote: Mapping[str, Any]) -> str | None:
    """Why no alive node can ever run a job with these `ray.remote` options (a
    job would wait forever), or None if some node can."""
    import ray

    asked = request(without_nulls(remote))
    nodes = [n["Resources"] for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
    if any(all(node.get(k, 0) >= v for k, v in asked.items()) for node in nodes):
        return None
    largest = {k: max((node.get(k, 0) for node in nodes), default=0) for k in asked}
    return f"each job asks for {asked}, and the most any node has is {largest}"


def single_machine() -> bool:
    """Whether every job runs on this machine: a local Ray, or a cluster of one
    node that is this one (not Ray Client, whose cluster is elsewhere)."""
    import ray

    alive = [n for n in ray.nodes() if n["Alive"]]  # type: ignore[no-untyped-call]
    return len(alive) == 1 and not _ray_client()


def _ray_client() -> bool:
    import ray

    return bool(ray.util.client.ray.is_connected())  # type: ignore[no-untyped-call]


def _wait_s(running: Mapping[Any, _Attempt], policy: Policy, *, poll: bool) -> float | None:
    """How long ray.wait may block: until the next attempt would time out, and
    at most a second when start events are to be polled."""
    if policy.job_timeout_s is None:
        return 1.0 if poll else None
    deadlines = [d for a in running.values() if (d := _deadline(a, policy)) is not None]
    # Queued jobs start without telling ray.wait: look again within a second.
    return max(0.0, min([*deadlines, time.monotonic() + 1.0]) - time.monotonic())


def _stop_gracefully(running: Mapping[Any, _Attempt], grace_s: float) -> list[Any]:
    """Ask every running job to stop (KeyboardInterrupt in it; those asked
    already, past their timeout, keep their own deadline) and wait up to
    `grace_s` for them to end; another Ctrl-C ends the wait at once. Returns
    the refs of the jobs still running."""
    import ray

    deadline = time.monotonic() + grace_s
    for ref, attempt in running.items():
        if attempt.stop_asked is None:
            ray.cancel(ref, force=False)
            attempt.stop_asked = time.monotonic()
        else:
            deadline = max(deadline, attempt.stop_asked + grace_s)
    log.warning(
        f"Asked {len(running)} running jobs to stop (KeyboardInterrupt in each, so that "
        f"they can save their work); those still running in {grace_s:g} s "
        "(hydra.launcher.stop_grace_s) are cancelled by force. Ctrl-C again: at once"
    )
    left = list(running)
    try:
        while left and time.monotonic() < deadline:
            left = [ref for ref in left if not _ended(ref)]
            if left:
                time.sleep(0.1)
    except KeyboardInterrupt:
        log.warning(f"Interrupted again: cancelling the {len(left)} running jobs by force")
    return left


def _ended(ref: Any) -> bool:
    """Whether the job's task has ended, without waiting (for a generator, its
    completion ref: its stream reads as finished once a stop is asked)."""
    import ray

    done = ref.completed() if isinstance(ref, ray.ObjectRefGenerator) else ref
    ready, _ = ray.wait([done], timeout=0)
    return bool(ready)


def _deadline(attempt: _Attempt, policy: Policy) -> float | None:
    """When the attempt is to be stopped (past its timeout), or, once asked to
    stop, cancelled by force; None: never (no timeout, or not started)."""
    if policy.job_timeout_s is None or attempt.started is None:
        return None
    if attempt.stop_asked is not None:
        return attempt.stop_asked + policy.stop_grace_s
    return attempt.started + policy.job_timeout_s


def _overdue(running: Mapping[Any, _Attempt], policy: Policy) -> list[tuple[Any, _Attempt]]:
    now = time.monotonic()
    return [
        (ref, a)
        for ref, a in running.items()
        if (deadline := _deadline(a, policy)) is not None and now > deadline
    ]


def _timed_out(attempt: _Attempt, policy: Policy) -> JobOutcome:
    job = attempt.job
    error = JobError(
        f"Job #{job.idx} ({describe(job.overrides) or 'no overrides'}) timed out after "
        f"{policy.job_timeout_s:g} s (hydra.launcher.job_timeout_s) and was cancelled"
    )
    return _failed(attempt, error, TIMED_OUT)


def _failed(attempt: _Attempt, error: BaseException, status: str) -> JobOutcome:
    job_return = JobReturn(overrides=list(attempt.job.overrides), status=JobStatus.FAILED)
    job_return.return_value = error
    now = time.time()
    ran_s = time.monotonic() - attempt.started if attempt.started is not None else 0.0
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


def _next_item(ref: Any, attempt: _Attempt) -> JobStarted | JobOutcome:
    """The next thing the job's task yielded (or returned, for a plain task), or a
    failed outcome that says why the job never returned (its process or node
    died, after Ray's retries)."""
    import ray

    job = attempt.job
    try:
        item: JobStarted | JobOutcome = ray.get(
            next(ref) if isinstance(ref, ray.ObjectRefGenerator) else ref
        )
        assert isinstance(item, JobStarted | JobOutcome)
        if (
            isinstance(item, JobOutcome)
            and attempt.pid is not None
            and (item.node_id, item.pid) != (attempt.node_id, attempt.pid)
        ):
            # Another process than the one that started it (a pid of another
            # node may be the same): its first process or node died and Ray ran
            # the task again (its start event is not repeated).
            item.ray_reruns = 1
        return item
    except (ray.exceptions.RayError, StopIteration) as exc:
        cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
        reason = f"{type(cause).__name__}: {cause}".strip()
        error = JobError(
            f"Job #{job.idx} ({describe(job.overrides) or 'no overrides'}) did not complete: "
            f"{reason}"
        )
        return _failed(attempt, error, FAILED)
