"""The body of one sweep job, run in a Ray worker process.

Imports nothing heavy at module level: Hydra imports this module during plugin
discovery. Ray's worker imports it by reference when it unpickles the task.
"""

import logging
import os
import sys
import time
import traceback
import types
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, open_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SweepState:
    """What every job of a sweep shares. Shipped to the cluster once and
    unpickled once per worker process, not once per job."""

    hydra_context: HydraContext
    task_function: TaskFunction
    config: DictConfig
    singleton_state: dict[str, Any]
    # The launching process's working dir: relative sweep dirs resolve against it.
    cwd: str
    # The app's script, whose functions cloudpickle ships by value.
    main_file: str | None


def capture_sweep_state(
    hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
) -> SweepState:
    return SweepState(
        hydra_context=hydra_context,
        task_function=task_function,
        config=config,
        singleton_state=Singleton.get_state(),
        cwd=str(config.hydra.runtime.cwd),
        main_file=getattr(sys.modules.get("__main__"), "__file__", None),
    )


@dataclass(frozen=True)
class JobStarted:
    """The first thing a job's task yields: the driver learns the job is running."""

    idx: int
    attempt: int
    node: str
    pid: int


# What a job ended as, in the summary and in sweep_summary.json.
SUCCEEDED = "succeeded"
FAILED = "failed"
TIMED_OUT = "timed out"
INTERRUPTED = "interrupted"


@dataclass
class JobOutcome:
    """A job's `JobReturn` and where, when and how it ran."""

    idx: int
    job_return: JobReturn
    started: float
    ended: float
    node: str
    pid: int = field(default_factory=os.getpid)
    # 1 for the first run of the job, 2 for its first retry, ...
    attempt: int = 1
    # The failure came from the task function (a retry may succeed), not from
    # composing the config or from the job's process dying.
    task_raised: bool = False
    # SUCCEEDED, FAILED, TIMED_OUT or INTERRUPTED.
    status: str = SUCCEEDED
    # Taken from the record of an earlier run of the sweep (resume), not run now.
    resumed: bool = False

    @property
    def duration(self) -> float:
        return self.ended - self.started

    @property
    def error(self) -> str | None:
        """One line on why the job failed; None if it succeeded."""
        if self.job_return.status == JobStatus.COMPLETED:
            return None
        err = self.job_return._return_value
        lines = str(err).strip().splitlines()
        return f"{type(err).__name__}: {lines[0] if lines else ''}".strip()


class JobError(RuntimeError):
    """Stands for a job's exception that could not travel back from the worker,
    or for a job that ended without returning (its process or node died)."""


# The SweepState this worker process unpickled last, by key.
_restored: dict[str, SweepState] = {}


def _restore(state_key: str, packed_state: list[Any]) -> SweepState:
    state = _restored.get(state_key)
    if state is None:
        import ray

        state = cloudpickle.loads(ray.get(packed_state[0]))
        assert isinstance(state, SweepState)
        if state.main_file is not None:
            _name_script_code(state.task_function, state.main_file)
        _restored.clear()
        _restored[state_key] = state
    # Restoring Hydra's singletons re-scans every plugin: do it for the first job
    # of a sweep in this process, or when another sweep's jobs ran in between.
    if Singleton._instances is not state.singleton_state["instances"]:
        Singleton.set_state(state.singleton_state)
    return state


def _name_script_code(task_function: Any, main_file: str) -> None:
    """cloudpickle names the code of functions it ships by value "<dynamic-code>";
    naming it after the app's script again lets job tracebacks show source lines."""
    seen: set[int] = set()

    def rename(code: types.CodeType) -> types.CodeType:
        consts = tuple(rename(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        return code.replace(co_filename=main_file, co_consts=consts)

    def visit(obj: Any) -> None:
        if not isinstance(obj, types.FunctionType) or id(obj) in seen:
            return
        seen.add(id(obj))
        if obj.__code__.co_filename == "<dynamic-code>":
            obj.__code__ = rename(obj.__code__)
            for value in list(obj.__globals__.values()):  # the script's helpers it calls
                visit(value)

    visit(task_function)


def run_one_job(
    state_key: str,
    packed_state: list[Any],
    idx: int,
    overrides: Sequence[str],
    composed: DictConfig | None = None,
    attempt: int = 1,
    attempts: int = 1,
) -> Iterator[JobStarted | JobOutcome]:
    """Compose job `idx`'s config from its overrides (unless it comes `composed`
    already) and run it with `run_job`. A Ray streaming generator: it yields
    JobStarted as soon as it runs (the driver's clock for the job's timeout
    starts then), then the JobOutcome.

    `packed_state` is a one-element list holding the object-store ref of the
    pickled SweepState: wrapped so that Ray does not fetch and unpickle it for
    every task; it is fetched only by a worker that has not restored it yet.
    `attempt` of `attempts` is this run's number among the runs the launcher's
    `retries` allow.
    """
    import ray

    started = time.time()
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    yield JobStarted(idx=idx, attempt=attempt, node=node, pid=os.getpid())
    yield _run(state_key, packed_state, idx, overrides, composed, attempt, attempts, started, node)


def run_one_job_reporting(
    board: Any,
    state_key: str,
    packed_state: list[Any],
    idx: int,
    overrides: Sequence[str],
    composed: DictConfig | None = None,
    attempt: int = 1,
    attempts: int = 1,
) -> JobOutcome:
    """run_one_job as a plain task, for Ray Client, which has no streaming
    generators: the start event goes to `board`, an actor the driver polls."""
    import ray

    started = time.time()
    node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
    board.started.remote(JobStarted(idx=idx, attempt=attempt, node=node, pid=os.getpid()))
    return _run(state_key, packed_state, idx, overrides, composed, attempt, attempts, started, node)


def _run(
    state_key: str,
    packed_state: list[Any],
    idx: int,
    overrides: Sequence[str],
    composed: DictConfig | None,
    attempt: int,
    attempts: int,
    started: float,
    node: str,
) -> JobOutcome:
    state = _restore(state_key, packed_state)
    task_raised = False
    try:
        os.makedirs(state.cwd, exist_ok=True)
        os.chdir(state.cwd)
        sweep_config = composed or state.hydra_context.config_loader.load_sweep_config(
            state.config, list(overrides)
        )
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = idx
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        task_function = state.task_function
        if attempts > 1:
            task_function = _announcing_attempt(task_function, idx, attempt, attempts)
        job_return = run_job(
            hydra_context=state.hydra_context,
            task_function=task_function,
            config=sweep_config,
            job_dir_key="hydra.sweep.dir",
            job_subdir_key="hydra.sweep.subdir",
        )
        task_raised = job_return.status == JobStatus.FAILED
    except Exception as exc:  # composing the config failed: the job never ran
        job_return = JobReturn(overrides=list(overrides), status=JobStatus.FAILED)
        job_return.return_value = exc
    status = SUCCEEDED
    if job_return.status == JobStatus.FAILED:
        job_return.return_value = _portable_error(job_return._return_value, idx, node)
        status = FAILED
    return JobOutcome(
        idx=idx,
        job_return=job_return,
        started=started,
        ended=time.time(),
        node=node,
        attempt=attempt,
        task_raised=task_raised,
        status=status,
    )


def _announcing_attempt(
    task_function: TaskFunction, idx: int, attempt: int, attempts: int
) -> TaskFunction:
    """The task function, preceded by a line in the job's own log (run_job has set
    that log up when it calls the task function) that says which attempt runs."""

    def task(cfg: DictConfig) -> Any:
        log.info(f"Job #{idx}: attempt {attempt} of {attempts}")
        return task_function(cfg)

    return task


def _portable_error(exc: BaseException, idx: int, node: str) -> BaseException:
    """The job's exception, made to cross process boundaries with its traceback.

    The traceback object does not pickle, so its text goes into the exception's
    notes (printed by Python 3.11+) and into the job's log file.
    """
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log.error("Job #%d failed on %s (pid %d):\n%s", idx, node, os.getpid(), text)
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:
        exc = JobError(f"{type(exc).__name__}: {exc}")
    notes = [*getattr(exc, "__notes__", []), f"[job #{idx} on {node}, pid {os.getpid()}]\n{text}"]
    # What add_note() does on Python 3.11+, also on 3.10.
    exc.__notes__ = notes  # type: ignore[attr-defined]
    return exc
