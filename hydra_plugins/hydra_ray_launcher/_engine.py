"""The execution engine: run a batch of sweep jobs as Ray tasks on the Ray this
process is connected to, and gather their `JobReturn`s.

Used unchanged by the local launcher and by the driver that runs on a cluster's
head. Ray is imported inside functions: Hydra imports this module at every start.
"""

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig

from ._jobs import JobError, JobOutcome, SweepState, run_one_job
from ._report import SweepReport, describe
from ._validate import ConfigError, without_nulls

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShippedState:
    """A SweepState in Ray's object store, under a key unique to it."""

    key: str
    ref: Any  # ray.ObjectRef of the cloudpickled SweepState
    ray_job_id: str  # refs are valid only while this Ray connection lives

    def is_current(self) -> bool:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_job_id() == self.ray_job_id


def ship_state(state: SweepState) -> ShippedState:
    """Put the state all jobs share into the object store, once for all jobs."""
    import ray

    return ShippedState(
        key=uuid.uuid4().hex,
        ref=ray.put(cloudpickle.dumps(state)),
        ray_job_id=ray.get_runtime_context().get_job_id(),
    )


def task_options(remote: Mapping[str, Any]) -> dict[str, Any]:
    """The `ray.remote` options of every job's task, checked by Ray itself."""
    import ray

    options = without_nulls(remote)
    try:
        ray.remote(run_one_job).options(**options)
    except (ValueError, TypeError) as exc:
        raise ConfigError(
            f"hydra.launcher.ray.remote is not valid for ray.remote(): {exc}. "
            "Use the option names and value types of ray.remote()."
        ) from exc
    return options


def run_jobs(
    shipped: ShippedState,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
    remote: Mapping[str, Any],
    configs: Sequence[DictConfig] | None = None,
) -> list[JobReturn]:
    """Run every job as a Ray task, concurrently, and return their `JobReturn`s in
    job order. Each job's config is composed in its worker, unless `configs`
    gives them composed already (nodes that lack the app's config files).

    A job that fails or whose process dies becomes a failed JobReturn; the
    others run on. On KeyboardInterrupt, the jobs still queued or running are
    cancelled before it propagates."""
    import ray

    options = task_options(remote)
    task = ray.remote(run_one_job)
    report = SweepReport(job_overrides, initial_job_idx)
    submitted = time.time()
    pending = []
    index_of: dict[Any, int] = {}
    for pos, overrides in enumerate(job_overrides):
        idx = initial_job_idx + pos
        ref = task.options(**options, name=f"hydra job #{idx}").remote(
            shipped.key, [shipped.ref], idx, list(overrides), configs[pos] if configs else None
        )
        pending.append(ref)
        index_of[ref] = idx
    results: list[JobReturn | None] = [None] * len(job_overrides)
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            if pending:  # collect everything else that is done too, without waiting
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready += more
            for ref in ready:
                idx = index_of[ref]
                outcome = _outcome(ref, idx, job_overrides[idx - initial_job_idx], submitted)
                results[idx - initial_job_idx] = outcome.job_return
                report.job_done(idx, outcome.job_return, outcome.duration, outcome.node)
    except KeyboardInterrupt:
        log.warning(f"Interrupted: cancelling {len(pending)} unfinished jobs")
        for ref in pending:
            ray.cancel(ref, force=True)
        raise
    report.close()
    return [r for r in results if r is not None]


def _outcome(ref: Any, idx: int, overrides: Sequence[str], submitted: float) -> JobOutcome:
    """The job's outcome, or a failed one that says why the job never returned."""
    import ray

    try:
        outcome = ray.get(ref)
        assert isinstance(outcome, JobOutcome)
        return outcome
    except ray.exceptions.RayError as exc:
        cause = exc.cause if isinstance(exc, ray.exceptions.RayTaskError) else exc
        reason = f"{type(cause).__name__}: {cause}".strip()
        error = JobError(
            f"Job #{idx} ({describe(overrides) or 'no overrides'}) did not complete: {reason}"
        )
        job_return = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        job_return.return_value = error
        return JobOutcome(
            idx=idx, job_return=job_return, started=submitted, ended=time.time(), node="?"
        )
