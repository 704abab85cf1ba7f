"""The execution engine: run a batch of sweep jobs as Ray tasks on the Ray this
process is connected to, and gather their `JobReturn`s. What runs next is the
`Scheduler`'s to decide (`engine.scheduler`); `RayBackend` here runs it.

Used unchanged by the local launcher and by the driver that runs on a cluster's
head. Imported when a sweep launches, never at Hydra's plugin scan (the face
imports nothing of `hydra_ray` at module level).
"""

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from hydra_ray.checks.resources import JobResources, request, without_nulls
from hydra_ray.core.errors import TaskLost
from hydra_ray.core.jobs import Job, JobOutcome, JobStarted, Policy
from hydra_ray.core.records import write_record
from hydra_ray.core.redact import redacting_logger
from hydra_ray.engine.gather import JobDirs
from hydra_ray.engine.report import SweepProgress
from hydra_ray.engine.scheduler import Attempt, Scheduler
from hydra_ray.engine.worker import ShippedState, run_one_job, run_one_job_reporting

log = redacting_logger(__name__)


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
    job order (see `Scheduler`). Each job asks Ray for what `resources` gives
    it; its config is composed in its worker, unless `resources` composed it
    already (for its options, or on a machine that has the app's config files).
    """
    backend = RayBackend(shipped)
    try:
        scheduler = Scheduler(
            backend,
            jobs,
            resources,
            policy=policy,
            progress=progress,
            limit=in_flight_limit(),
            on_finished=on_finished,
            on_started=on_started,
        )
        return scheduler.run()
    finally:
        backend.close()


class RayBackend:
    """The scheduler's attempts as Ray tasks: streaming generators that yield
    the job's start, then its outcome; under Ray Client, which has no streaming
    generators, plain tasks that tell a small actor when they start."""

    def __init__(self, shipped: ShippedState) -> None:
        import ray

        self.shipped = shipped
        self.board: Any = ray.remote(num_cpus=0)(StartBoard).remote() if _ray_client() else None
        self.polls = self.board is not None
        if self.board is None:
            self.streaming: dict[str, Any] = {"num_returns": "streaming"}
            self.task = ray.remote(run_one_job)
        else:
            self.streaming = {}
            self.task = ray.remote(run_one_job_reporting)

    def submit(self, attempt: Attempt, attempts: int) -> Any:
        job, shipped = attempt.job, self.shipped
        args = (
            shipped.key,
            [shipped.ref],
            job.idx,
            job.overrides,
            attempt.config,
            attempt.number,
            attempts,
        )
        named = self.task.options(**attempt.options, **self.streaming, name=f"hydra job #{job.idx}")
        return named.remote(*args) if self.board is None else named.remote(self.board, *args)

    def wait(self, refs: Sequence[Any], timeout: float | None) -> list[Any]:
        import ray

        if not refs:
            if timeout:
                time.sleep(timeout)
            return []
        ready, _ = ray.wait(list(refs), num_returns=1, timeout=timeout)
        if ready and len(refs) > 1:  # all else that is ready, without waiting
            ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=0)
        return list(ready)

    def next_item(self, ref: Any) -> JobStarted | JobOutcome:
        """The next thing the job's task yielded (or returned, for a plain task);
        TaskLost if none came: its process or node died (after Ray's retries), or
        it was cancelled."""
        import ray

        try:
            item: JobStarted | JobOutcome = ray.get(
                next(ref) if isinstance(ref, ray.ObjectRefGenerator) else ref
            )
        except (ray.exceptions.RayError, StopIteration) as exc:
            cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
            raise TaskLost(f"{type(cause).__name__}: {cause}".strip()) from None
        assert isinstance(item, JobStarted | JobOutcome)
        return item

    def ended(self, ref: Any) -> bool:
        """Whether the job's task has ended, without waiting (for a generator, its
        completion ref: its stream reads as finished once a stop is asked)."""
        import ray

        done = ref.completed() if isinstance(ref, ray.ObjectRefGenerator) else ref
        ready, _ = ray.wait([done], timeout=0)
        return bool(ready)

    def cancel(self, ref: Any, *, force: bool) -> None:
        import ray

        ray.cancel(ref, force=force)

    def started_events(self) -> list[JobStarted]:
        import ray

        if self.board is None:
            return []
        events: list[JobStarted] = ray.get(self.board.drain.remote())
        return events

    def close(self) -> None:
        import ray

        if self.board is not None:
            ray.kill(self.board)


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
