"""The body of one sweep job, run in a Ray worker process; the SweepState
captured on the launching side, shipped once to Ray's object store
(`ShippedState`) and restored once per worker process, with the app's script
made the jobs' `__main__` there (`engine.script`).

Ray's worker imports it by reference when it unpickles the task, in every
worker process that runs a job: it imports nothing heavy at module level (no Ray).
"""

import contextlib
import os
import sys
import time
import traceback
import types
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, run_job
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

from hydra_ray import FACE
from hydra_ray.core.errors import JobError
from hydra_ray.core.held import hold
from hydra_ray.core.jobs import (
    FAILED,
    SUCCEEDED,
    Job,
    JobOutcome,
    JobStarted,
    SweepState,
)
from hydra_ray.core.redact import redacting_logger
from hydra_ray.core.tracebacks import drop_chain, pack
from hydra_ray.engine.script import Main, as_main, load, plain_children, script_of
from hydra_ray.engine.snapshot import portable_context, why_not_portable

log = redacting_logger(__name__)


@dataclass(frozen=True)
class ShippedState:
    """A SweepState in Ray's object store, under a key unique to it."""

    key: str
    ref: Any  # ray.ObjectRef of the cloudpickled SweepState
    ray_job_id: str  # refs are valid only while this Ray connection lives

    def is_current(self) -> bool:
        import ray

        return ray.is_initialized() and ray.get_runtime_context().get_job_id() == self.ray_job_id


def ship_state(state: "SweepState") -> ShippedState:
    """Put the state all jobs share into the object store, once for all jobs
    (the other Hydra plugins' classes by value: Ray Client's workers, or another
    machine's, need not have them)."""
    import ray

    return ShippedState(
        key=uuid.uuid4().hex,
        ref=ray.put(dumps_for_cluster(state)),
        ray_job_id=ray.get_runtime_context().get_job_id(),
    )


def capture_sweep_state(
    hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
) -> SweepState:
    """The state's config loader reads a snapshot of this machine's config
    sources: each job composes its config where it runs, also on machines that
    lack the app's config files (a cluster, Ray Client), and quicker than from
    the files; nothing in the state grows with the number of jobs (where a
    snapshot cannot stand in on other machines: `composed_here`)."""
    return SweepState(
        hydra_context=portable_context(hydra_context),
        task_function=task_function,
        config=config,
        singleton_state=Singleton.get_state(),
        cwd=str(config.hydra.runtime.cwd),
        code_files={
            (fn.__module__, fn.__qualname__): fn.__code__.co_filename
            for fn in _functions(task_function)
        },
        script=script_of(task_function),
    )


def composed_here(
    hydra_context: HydraContext, config: DictConfig, jobs: "Sequence[Job]"
) -> dict[int, DictConfig] | None:
    """For jobs on machines that lack the app's config files: their configs
    composed on this machine, where the snapshot in the sweep state cannot
    stand in (`why_not_portable`); None where it can, and the jobs compose
    their own where they run."""
    why = why_not_portable(config, [j.overrides for j in jobs])
    if why is None:
        return None
    log.info(f"Composing the {len(jobs)} jobs' configs on this machine: {why}")
    return compose_each(hydra_context, config, jobs)


def compose_each(
    hydra_context: HydraContext, config: DictConfig, jobs: "Sequence[Job]"
) -> dict[int, DictConfig]:
    """Every job's config (by job index), composed here."""
    loader = hydra_context.config_loader
    return {j.idx: loader.load_sweep_config(config, j.overrides) for j in jobs}


def dumps_for_cluster(obj: Any) -> bytes:
    """`obj` pickled for a cluster whose Python lacks the other Hydra plugins of
    this machine: their classes (a sweeper's config dataclasses, which type the
    composed configs and fill the ConfigStore) travel by value, not by name. The
    sweeper runs here; the jobs only carry its config. If a plugin's objects
    cannot be pickled by value, by name it is (the cluster then needs it)."""
    ours = FACE  # by name: shipped with the job spec, or installed
    foreign = [
        module
        for name, module in list(sys.modules.items())
        if name.startswith("hydra_plugins.") and not name.startswith(ours) and module is not None
    ]
    for module in foreign:
        cloudpickle.register_pickle_by_value(module)
    try:
        blob: bytes = cloudpickle.dumps(obj)
        return blob
    except Exception as exc:  # whatever fails by value: by name, as before
        log.debug(f"Other plugins' objects not picklable by value ({exc}): pickled by name")
    finally:
        for module in foreign:
            cloudpickle.unregister_pickle_by_value(module)
    blob = cloudpickle.dumps(obj)
    return blob


# The SweepState this worker process unpickled last, by key, and its app's script.
_restored: dict[str, SweepState] = {}
_mains: dict[str, Main] = {}


def _restore(state_key: str, packed_state: list[Any]) -> SweepState:
    state = _restored.get(state_key)
    if state is None:
        import ray

        state = cloudpickle.loads(ray.get(packed_state[0]))
        assert isinstance(state, SweepState)
        _name_shipped_code(state.task_function, state.code_files)
        _restored.clear()
        _restored[state_key] = state
    # Restoring Hydra's singletons re-scans every plugin: do it for the first job
    # of a sweep in this process, or when another sweep's jobs ran in between.
    if Singleton._instances is not state.singleton_state["instances"]:
        Singleton.set_state(state.singleton_state)
    return state


def _main(state_key: str, state: SweepState, overrides: Sequence[str]) -> Main | None:
    """The app's script as a module, made once per worker process and sweep (in
    the jobs' working dir, after Hydra's singletons are restored: what it stores
    in the ConfigStore is its own); None if the task is not the script's."""
    if state.script is None:
        return None
    main = _mains.get(state_key)
    if main is None:
        main = load(state.script, overrides)
        if main.module is None:
            log.warning(
                f"The app's script {main.path} could not be made the jobs' __main__ "
                f"({main.why}): its task runs as shipped, where plain pickle (multiprocessing, "
                "torch.save) cannot find the script's classes and functions by name"
            )
        _mains.clear()
        _mains[state_key] = main
    return main


def _functions(root: Any, limit: int = 5000) -> Iterator[types.FunctionType]:
    """The functions reachable from `root` as the task runs them: `root` itself
    (a function, a bound method or a callable object), the globals its code
    names, its closure, an object's attributes and its class's methods."""
    seen: set[int] = set()
    todo = [root]
    while todo and len(seen) < limit:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, types.ModuleType):
            continue
        seen.add(id(obj))
        if isinstance(obj, types.FunctionType):
            yield obj
            names = [n for n in _names(obj.__code__) if n in obj.__globals__]
            todo += [obj.__globals__[n] for n in names]
            todo += [c.cell_contents for c in obj.__closure__ or () if _filled(c)]
        elif isinstance(obj, types.MethodType):
            todo += [obj.__func__, obj.__self__]
        elif isinstance(obj, type):
            todo += list(vars(obj).values())
        elif hasattr(obj, "__dict__"):
            todo += [*vars(obj).values(), type(obj)]


def _names(code: types.CodeType) -> Iterator[str]:
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _names(const)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018
    except ValueError:  # an empty cell
        return False
    return True


def _name_shipped_code(task_function: Any, files: dict[tuple[str, str], str]) -> None:
    """Give the code cloudpickle named "<dynamic-code>" its file's name again, so
    that job tracebacks name it (with source lines where the file is)."""

    def rename(code: types.CodeType, filename: str) -> types.CodeType:
        consts = tuple(
            rename(c, filename) if isinstance(c, types.CodeType) else c for c in code.co_consts
        )
        return code.replace(co_filename=filename, co_consts=consts)

    for fn in _functions(task_function):
        filename = files.get((fn.__module__, fn.__qualname__))
        if fn.__code__.co_filename == "<dynamic-code>" and filename:
            fn.__code__ = rename(fn.__code__, filename)


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
    JobStarted as soon as the job's dir is known (the driver's clock for the
    job's timeout starts then), then the JobOutcome.

    `packed_state` is a one-element list holding the object-store ref of the
    pickled SweepState: wrapped so that Ray does not fetch and unpickle it for
    every task; it is fetched only by a worker that has not restored it yet.
    `attempt` of `attempts` is this run's number among the runs the launcher's
    `retries` allow.
    """
    job = _Prepared.compose(state_key, packed_state, idx, overrides, composed)
    yield job.started(attempt)
    yield job.run(attempt, attempts)


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
    job = _Prepared.compose(state_key, packed_state, idx, overrides, composed)
    board.started.remote(job.started(attempt))
    return job.run(attempt, attempts)


@dataclass
class _Prepared:
    """A job in its worker, its config composed (or why it could not be)."""

    state: SweepState
    idx: int
    overrides: Sequence[str]
    config: DictConfig | None
    error: Exception | None
    started_at: float
    node: str
    node_id: str
    main: Main | None

    @classmethod
    def compose(
        cls,
        state_key: str,
        packed_state: list[Any],
        idx: int,
        overrides: Sequence[str],
        composed: DictConfig | None,
    ) -> "_Prepared":
        import ray

        started_at = time.time()
        node = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        node_id = ray.get_runtime_context().get_node_id()
        state = _restore(state_key, packed_state)
        plain_children()
        config, error, main = None, None, None
        try:
            os.makedirs(state.cwd, exist_ok=True)
            os.chdir(state.cwd)
            main = _main(state_key, state, overrides)
            config = composed or state.hydra_context.config_loader.load_sweep_config(
                state.config, list(overrides)
            )
            with open_dict(config):
                config.hydra.job.id = str(idx)  # a str field: Hydra 1.4 warns on an int
                config.hydra.job.num = idx
                if main is not None and main.cwd is not None:
                    # The launch's working dir as sync_up sent it to this node.
                    config.hydra.runtime.cwd = main.cwd
                elif composed is None:
                    # As composed where the sweep was launched (get_original_cwd(), as
                    # Hydra's launchers give it), not in this node's working dir.
                    config.hydra.runtime.cwd = state.config.hydra.runtime.cwd
                if state.sweep_dir is not None:
                    config.hydra.sweep.dir = state.sweep_dir
            HydraConfig.instance().set_config(config)
        except Exception as exc:  # composing the config failed: the job never runs
            config, error = None, exc
        return cls(state, idx, overrides, config, error, started_at, node, node_id, main)

    @property
    def job_dir(self) -> str | None:
        """The output dir run_job gives the job (its keys, relative to the job's cwd)."""
        if self.config is None:
            return None
        sweep_dir = str(OmegaConf.select(self.config, "hydra.sweep.dir"))
        subdir = str(OmegaConf.select(self.config, "hydra.sweep.subdir"))
        return os.path.abspath(os.path.join(sweep_dir, subdir))

    def started(self, attempt: int) -> JobStarted:
        return JobStarted(
            idx=self.idx,
            attempt=attempt,
            node=self.node,
            pid=os.getpid(),
            node_id=self.node_id,
            job_dir=self.job_dir,
        )

    def run(self, attempt: int, attempts: int) -> JobOutcome:
        task_raised = False
        job_return = JobReturn(overrides=list(self.overrides), status=JobStatus.FAILED)
        job_return.return_value = self.error
        if self.config is not None:
            main = self.main
            task_function = (main and main.task) or self.state.task_function
            if attempts > 1:
                task_function = _announcing_attempt(task_function, self.idx, attempt, attempts)
            try:
                with _as_its_script(main, self.overrides):
                    job_return = run_job(
                        hydra_context=self.state.hydra_context,
                        task_function=task_function,
                        config=self.config,
                        job_dir_key="hydra.sweep.dir",
                        job_subdir_key="hydra.sweep.subdir",
                    )
                task_raised = job_return.status == JobStatus.FAILED
            except Exception as exc:  # run_job could not set the job up: it never ran
                job_return.return_value = exc
        status = SUCCEEDED
        if job_return.status == JobStatus.FAILED:
            job_return.return_value = _portable_error(job_return._return_value, self.idx, self.node)
            status = FAILED
        return JobOutcome(
            idx=self.idx,
            job_return=hold(job_return),
            started=self.started_at,
            ended=time.time(),
            node=self.node,
            node_id=self.node_id,
            job_dir=self.job_dir,
            attempt=attempt,
            task_raised=task_raised,
            status=status,
        )


def _as_its_script(
    main: Main | None, overrides: Sequence[str]
) -> "contextlib.AbstractContextManager[None]":
    """The job runs as `python <script> <its overrides>` would (see `engine.script`)."""
    if main is None:
        return contextlib.nullcontext()
    return as_main(main.module, main.path, overrides)


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

    The traceback object does not pickle: its frames and the exception's causes
    are packed for the other side (`core.tracebacks`), its text goes into the
    exception's notes (printed by Python 3.11+) and into the job's log file.
    """
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    log.error("Job #%d failed on %s (pid %d):\n%s", idx, node, os.getpid(), text)
    pack(exc)
    if not _pickles(exc):
        drop_chain(exc)
        if not _pickles(exc):
            error = JobError(f"{type(exc).__name__}: {exc}").with_traceback(exc.__traceback__)
            pack(error)
            exc = error
    notes = [*getattr(exc, "__notes__", []), f"[job #{idx} on {node}, pid {os.getpid()}]\n{text}"]
    # What add_note() does on Python 3.11+, also on 3.10.
    exc.__notes__ = notes  # type: ignore[attr-defined]
    return exc


def _pickles(exc: BaseException) -> bool:
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
    except Exception:  # whatever the exception's own pickling raises
        return False
    return True
