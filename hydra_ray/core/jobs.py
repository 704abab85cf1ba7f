"""The sweep's data types: a job (`Job`), how failing and slow jobs are treated
(`Policy`), what every job shares (`SweepState`, with the app's `Script`), and
what a job reports when it starts (`JobStarted`) and when it ends (`JobOutcome`,
with its status).

Records and returns pickle these classes by name: they stay here. No Ray.
"""

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

from hydra_ray.core.tracebacks import unpack


@dataclass(frozen=True)
class Job:
    """One job of a sweep: its number and its overrides."""

    idx: int
    overrides: list[str]


@dataclass(frozen=True)
class Policy:
    """How the engine treats failing and slow jobs: the launcher keys of the
    same names (`launch.sweep.sweep_settings` reads them). The defaults, for
    an engine run without a launcher (tests, benchmarks), are the face's
    (a test holds them equal)."""

    # Runs a job again this many times at most when its task function raises.
    retries: int = 0
    # Cancels an attempt that has run longer than this; None: no limit.
    job_timeout_s: float | None = None
    # At most this many attempts in flight; None: as many as in_flight_limit().
    max_concurrent_jobs: int | None = None
    # An attempt past its timeout is first stopped catchably (KeyboardInterrupt in
    # the job, Ray's own cancel), then cancelled by force this long after.
    stop_grace_s: float = 10.0
    # A timed-out job runs again, within `retries`, like one that raised.
    retry_timed_out: bool = False


@dataclass(frozen=True)
class Script:
    """The app's script as it was at launch: each job runs with a module made
    from it as its `__main__` (see `engine.script`)."""

    source: str
    # Its absolute path on the launching machine.
    path: str
    # Its path relative to the code that sync_up sends to a cluster, where the
    # jobs find it on their sys.path; None where nothing sends it (jobs look at `path`).
    sent_as: str | None
    # The launch's working dir relative to that code, where it is in it: the
    # jobs' original cwd is its copy on their node.
    cwd_sent_as: str | None
    # Run as `python -m NAME`: NAME and its package; None for a script run by path.
    module: str | None
    package: str | None
    # The task function in it: its qualified name and first line; None when the
    # script imports it (a thin entry script, a console script): the jobs then
    # run it as shipped, the script still their `__main__` and argv[0].
    task: tuple[str, int] | None


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
    # The file of each function reachable from the task function, by (module,
    # qualname): cloudpickle ships some by value (the app's script's, local ones),
    # naming their code "<dynamic-code>", and the jobs' tracebacks need the name.
    code_files: dict[tuple[str, str], str]
    # Where the jobs write instead of their config's hydra.sweep.dir: on a cluster,
    # when that is an absolute path of the launching machine. None: as configured.
    sweep_dir: str | None = None
    # The app's script, when the task function is defined in it (its `__main__`).
    script: Script | None = None


@dataclass(frozen=True)
class JobStarted:
    """The first thing a job's task yields: the driver learns the job is running,
    where, and in which dir it writes (also a job that times out or crashes
    later wrote there: the gather fetches that dir from that node)."""

    idx: int
    attempt: int
    node: str
    pid: int
    # The Ray node id of `node`.
    node_id: str = ""
    # The job's output dir, absolute on that node; None if its config could not
    # be composed (the job wrote nothing).
    job_dir: str | None = None


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
    # The Ray node id of `node`, and the job's output dir there (None: unknown).
    node_id: str = ""
    job_dir: str | None = None
    # 1 for the first run of the job, 2 for its first retry, ...
    attempt: int = 1
    # The failure came from the task function (a retry may succeed), not from
    # composing the config or from the job's process dying.
    task_raised: bool = False
    # Runs Ray made after the job's process or node died (hydra.launcher.ray.remote
    # .max_retries), at least this many: Ray does not say how often.
    ray_reruns: int = 0
    # SUCCEEDED, FAILED, TIMED_OUT or INTERRUPTED.
    status: str = SUCCEEDED
    # Taken from the record of an earlier run of the sweep (resume), not run now.
    resumed: bool = False
    # What the job asked Ray for ({"CPU": 2, "GPU": 1}), where hydra.launcher.ray
    # .remote differs per job; None where every job asks for the same.
    resources: dict[str, float] | None = None
    # Where the job's outputs stayed, when a node did not give them (it is
    # gone, or unreachable): "" when they came home.
    outputs_left: str = ""

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Unpickled (from a worker, the head's returns, a record): the job's
        # exception gets its traceback and causes back (see `core.tracebacks`).
        self.__dict__.update(state)
        self.job_return._return_value = unpack(getattr(self.job_return, "_return_value", None))

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
