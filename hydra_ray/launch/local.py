"""Launch of the `ray` launcher: start or connect to Ray once per process, ship
the sweep state once, run the engine."""

import contextlib
import logging
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hydra_ray.checks.resources import for_sweep
from hydra_ray.checks.validate import ray_init_kwargs, refuse, sweep_problems
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.jobs import JobOutcome, JobStarted
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.core.wire import PACKAGES
from hydra_ray.driver.protocol import stage_plugin
from hydra_ray.engine import run as engine
from hydra_ray.engine.gather import JobDirs, gather_outputs
from hydra_ray.engine.worker import capture_sweep_state, composed_here, ship_state
from hydra_ray.infra.connect import check_connection
from hydra_ray.infra.procs import descendants, kill_new_descendants
from hydra_ray.infra.scratch import scratch_dir
from hydra_ray.launch import skeleton
from hydra_ray.launch.sweep import Batch, SweepBook

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import Session

log = redacting_logger(__name__)

# True once this process has started (or connected to) Ray through ray.init()
# itself, as opposed to finding Ray already initialised by the user's code.
_ray_initialised_here = False
# This machine's scratch dir of the plugin staged for Ray Client.
_SCRATCH = "hydra-ray-client"


class Local(skeleton.LaunchPath):
    """The `ray` launcher's hooks (see skeleton.LaunchPath)."""

    def prepare_process(self, session: "Session") -> None:
        # Each job's own lines matter in a sweep: Ray's log deduplication (read when
        # ray is imported) would fold "similar" lines of different jobs into one.
        os.environ.setdefault("RAY_DEDUP_LOGS", "0")
        if not sys.stdout.isatty():
            # Logs in a file or CI: the prefix of the jobs' lines without colour codes
            # (read by Ray at every line).
            os.environ.setdefault("RAY_COLOR_PREFIX", "0")

    def dry_run(
        self, session: "Session", job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        from hydra_ray.launch.plan import dry_run_local

        dry_run_local(session.hydra_context, session.config, session.settings, job_overrides, first)

    def check(self, session: "Session") -> None:
        refuse(sweep_problems(session.settings))  # before Ray starts

    def run_batch(self, session: "Session", book: SweepBook, current: Batch) -> list[JobOutcome]:
        return _run_here(session, book, current, session.settings.ray_init)

    def interrupted(self) -> None:
        stop_ray()


def _run_here(
    session: "Session",
    book: SweepBook,
    current: Batch,
    init: dict[str, Any],
) -> list[JobOutcome]:
    """Start (or connect to) Ray once, ship the sweep state once, run the batch."""
    config = session.config
    # Each job's hydra.launcher.ray.remote, where it interpolates into the job's
    # config: a value that does not resolve is refused before Ray starts.
    resources = for_sweep(session.hydra_context, config)
    resources.resolve_ahead(current.to_run)
    start_ray(init)
    # "local" (ray.init's own word for a new local Ray) is no cluster.
    connected = (init.get("address") or os.environ.get("RAY_ADDRESS") or "local") != "local"
    for options, jobs in resources.distinct(current.to_run):
        _check_schedulable(options, jobs, connected=connected)
    if session.shipped is None or not session.shipped.is_current():
        state = capture_sweep_state(session.hydra_context, session.task_function, config)
        session.shipped = ship_state(state)
    if not engine.single_machine():
        # Other machines need not have the app's config files.
        configs = composed_here(session.hydra_context, config, current.to_run)
        if configs is not None:
            resources = for_sweep(session.hydra_context, config, configs)

    def started(event: JobStarted) -> None:
        book.started_on[event.idx] = event.node

    return engine.run_batch_here(
        session.shipped,
        current.to_run,
        resources,
        policy=book.settings.policy,
        sweep_dir=book.sweep_dir,
        live=book.settings.live,
        already_done=current.already_done,
        # On a cluster of several machines, bring home what jobs wrote on the others.
        gather=lambda job_dirs: _gather_quietly(
            book.sweep_dir, job_dirs, jobs_cwd=str(config.hydra.runtime.cwd)
        ),
        on_started=started,
        key=book.key,
    )


def _check_schedulable(
    remote: Mapping[str, Any], jobs: Sequence[int] | None, *, connected: bool
) -> None:
    """A job no node can run would wait forever: refuse on a Ray of fixed size
    (the local one), warn on a cluster (its autoscaler may add such nodes).
    `jobs`: the jobs that ask for `remote`; None: every job."""
    why = engine.unschedulable(remote)
    if why is None:
        return
    which = "a job" if jobs is None else "job #" + ", #".join(map(str, jobs))
    if connected:
        log.warning(
            f"No node of the cluster can run {which} now ({why}): it waits until the "
            "cluster has such a node (hydra.launcher.ray.remote)"
        )
        return
    refused = (
        "No job can run" if jobs is None else f"No node can run job #{', #'.join(map(str, jobs))}"
    )
    raise ConfigError(
        f"{refused} on this Ray: {why}. Lower hydra.launcher.ray.remote.num_cpus / "
        "num_gpus / memory / resources, or give the local Ray more "
        "(hydra.launcher.ray.init.num_cpus, ...)"
    )


def _gather_quietly(sweep_dir: Path, job_dirs: JobDirs, *, jobs_cwd: str) -> None:
    """Gather (each node that fails is named in the log, its files left there),
    without hiding the sweep's own outcome if the cluster itself is gone."""
    import ray

    try:
        # abspath, as the jobs name their dirs; the jobs' working dir is the user's.
        gather_outputs(
            Path(os.path.abspath(sweep_dir)), job_dirs, jobs_cwd=jobs_cwd, cwd_is_ours=False
        )
    except (ray.exceptions.RayError, OSError) as exc:
        log.error(f"Could not bring home the outputs written on other nodes: {exc}")


def start_ray(init: dict[str, Any]) -> None:
    """ray.init() with the user's options, unless Ray is already initialised in
    this process (an earlier batch of this sweep, or the user's own code).
    Raises ConfigError when ray.init() refuses the options or the cluster (with
    Ray's reasons); a Ctrl-C stops what Ray had started and goes on."""
    import ray

    global _ray_initialised_here
    if ray.is_initialized():
        return
    kwargs = ray_init_kwargs(init)
    # The secrets of runtime_env.env_vars, passwords and tokens are not for logs.
    log.info(f"Initializing ray with config: {redacted(kwargs)}")
    if not sys.stdout.isatty():
        # Ray colours parts of its own log lines whatever the output is.
        for handler in logging.getLogger("ray").handlers:
            handler.addFilter(_strip_colours)
    check_connection(kwargs)
    before = descendants()
    try:
        with _ctrl_c_not_lost(), _plugin_shipped(kwargs) as shipping:
            _init(shipping)
    except KeyboardInterrupt:
        # Ctrl-C while Ray starts: stop what it started so far, now, not at exit
        # (Ray's exit hooks would leave its agents for a minute and exit with 1).
        kill_new_descendants(before)
        ray.shutdown()
        raise
    except (ValueError, TypeError, RuntimeError, ConnectionError) as exc:
        # Ray's reason is often in the chained cause (e.g. a missing auth token).
        reasons, cause = [f"{type(exc).__name__}: {exc}"], exc.__cause__
        while cause is not None:
            reasons.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__
        raise ConfigError(
            f"ray.init() refused hydra.launcher.ray.init {redacted(kwargs)}: "
            + "; caused by ".join(reasons)
        ) from exc
    _ray_initialised_here = True


@contextlib.contextmanager
def _plugin_shipped(kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """`kwargs`, and for Ray Client (`ray://`) this plugin's two packages in its
    runtime_env's py_modules: the cluster's workers import the very code of this
    machine, and need not have the plugin installed (nor another version of it).
    Ray uploads them in ray.init() (once per content: it keeps them by hash)."""
    if not str(kwargs.get("address") or "").startswith("ray://"):
        yield kwargs
        return
    with scratch_dir(_SCRATCH) as staged:
        stage_plugin(staged, display=False)
        runtime_env = dict(kwargs.get("runtime_env") or {})
        theirs = list(runtime_env.get("py_modules") or [])
        runtime_env["py_modules"] = [*theirs, *(str(staged / p) for p in PACKAGES)]
        yield {**kwargs, "runtime_env": runtime_env}


@contextlib.contextmanager
def _ctrl_c_not_lost() -> Iterator[None]:
    """Ctrl-C raises KeyboardInterrupt as usual, and once more at the end if it
    was raised where Python drops it: ray.init() forks its processes, and an
    interrupt that lands in a fork hook (logging's lock release) is "ignored"."""
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    pressed = threading.Event()

    def on_ctrl_c(signum: int, frame: Any) -> None:
        pressed.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
        if pressed.is_set():
            raise KeyboardInterrupt
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# A Ray Client server (ray://) starts one server process per client; on a busy
# head that process can die at start, and the next client gets a new one.
# Nothing has run yet: trying again is safe.
_CLIENT_TRIES = 4
_CLIENT_SERVER_DIED = (
    "Starting Ray client server failed",  # it died before the proxy saw it run
    "Proxy failed to Connect to backend",  # it died before it listened
    # It died while the proxy looked at it: Ray's proxy raises instead of
    # reporting (seen on loaded machines, with no fault of ours injected).
    "psutil.ZombieProcess",
)


def _init(kwargs: dict[str, Any]) -> None:
    import ray

    for attempt in range(1, _CLIENT_TRIES + 1):
        try:
            ray.init(**kwargs)
            return
        except ConnectionError as exc:
            if attempt == _CLIENT_TRIES or not any(m in str(exc) for m in _CLIENT_SERVER_DIED):
                raise
            reason = str(exc).strip().splitlines()[-1]
            log.warning(
                f"The Ray Client server at {kwargs.get('address')} could not start a server "
                f"for this client (try {attempt} of {_CLIENT_TRIES}); trying again. "
                f"Its words: {reason}"
            )
            ray.shutdown()
            time.sleep(3 * attempt)


_ESCAPES = re.compile(r"\x1b\[[0-9;]*m")


def _strip_colours(record: logging.LogRecord) -> bool:
    record.msg = _ESCAPES.sub("", str(record.msg))
    if isinstance(record.args, tuple):
        record.args = tuple(_ESCAPES.sub("", a) if isinstance(a, str) else a for a in record.args)
    return True


def stop_ray() -> None:
    """Shut down the Ray this launcher started, so that no worker outlives an
    interrupted sweep; a Ray the user initialised is theirs to stop."""
    import ray

    global _ray_initialised_here
    if _ray_initialised_here and ray.is_initialized():
        log.warning("Shutting down Ray")
        ray.shutdown()
        _ray_initialised_here = False
