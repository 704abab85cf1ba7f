"""Launch of the `ray_jobs` launcher: each batch of the sweep is one Ray job,
submitted through the cluster's dashboard (Ray's Jobs API). Its working_dir
holds the user's code, this plugin and the job spec; its driver is the head
driver the cluster launchers run; the results and outputs come home as one
file served by the dashboard's log API. Nothing here needs SSH or the GCS port."""

import asyncio
import copy
import json
import os
import re
import shlex
import subprocess
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from omegaconf import DictConfig

from hydra_ray.checks.dashboard import jobs_problems
from hydra_ray.checks.resources import without_nulls
from hydra_ray.checks.validate import refuse
from hydra_ray.core.errors import ConfigError, DriverError, LostDashboardError, OutputsNotHomeError
from hydra_ray.core.jobs import JobOutcome
from hydra_ray.core.records import (
    note_detached_run,
    note_detached_run_home,
)
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.core.settings import JobsSettings, SyncDown
from hydra_ray.core.wire import (
    DRIVER_MODULE,
    JOB_SPEC,
    PACK_MARK,
    PACK_PLAN,
    PLUGIN_DIR,
    PYTHON_MARK,
)
from hydra_ray.driver.protocol import PackPlan, ray_job_entrypoint, stage_plugin, write_job_spec
from hydra_ray.engine.worker import dumps_for_cluster
from hydra_ray.infra.dashboard import (
    UPLOAD_LIMIT,
    Dashboard,
    dashboard_for,
    download,
    lost_connection,
)
from hydra_ray.infra.scratch import scratch_dir
from hydra_ray.infra.storage import fetch_checked, remove_quietly
from hydra_ray.infra.sync import rsync_command
from hydra_ray.launch import detached, skeleton
from hydra_ray.launch.detached import nums
from hydra_ray.launch.sweep import (
    Batch,
    SweepBook,
    build_job_spec,
    warn_if_script_left_out,
)

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import Session

log = redacting_logger(__name__)

# This machine's scratch dirs (see `infra.scratch`): the package, a pack coming home.
SCRATCH = "hydra-ray-jobs"
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


class ThroughDashboard(skeleton.LaunchPath):
    """The `ray_jobs` launcher's hooks (see skeleton.LaunchPath)."""

    def dry_run(
        self, session: "Session", job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        from hydra_ray.launch.plan import dry_run_jobs

        dry_run_jobs(
            session.hydra_context,
            session.config,
            session.settings_as(JobsSettings),
            job_overrides,
            first,
        )

    def check(self, session: "Session") -> None:
        """Also that the dashboard (and sync_down.storage) answers, before any upload."""
        settings = session.settings_as(JobsSettings)
        refuse(jobs_problems(settings))
        _check_reachable(settings)

    def run_batch(self, session: "Session", book: SweepBook, current: Batch) -> list[JobOutcome]:
        dashboard = dashboard_for(session.settings_as(JobsSettings))
        return detached.run_batch(_ThroughJobsApi(session, book, dashboard), book, current)


def _check_reachable(settings: JobsSettings) -> None:
    """Before the sweep dir is touched: a dashboard out of reach, a token it
    refuses, a sync_down.storage this machine cannot read. Raises ConfigError."""
    if settings.sync_down.storage is not None:
        from hydra_ray.infra.storage import check_reachable

        check_reachable(settings.sync_down.storage)
    dashboard_for(settings).client()


class _ThroughJobsApi:
    """The transport of the `ray_jobs` launcher: each run a Ray job, submitted,
    followed and brought home through the cluster's dashboard."""

    def __init__(self, session: "Session", book: SweepBook, dashboard: Dashboard):
        self.notes = SUBMISSIONS
        self.session = session
        self.book = book
        self.dashboard = dashboard
        self.settings = session.settings_as(JobsSettings)
        self.client = dashboard.client()

    def run(self, remaining: Batch) -> list[JobOutcome]:
        return _run_as_ray_job(self.session, self.book, remaining, self.dashboard, self.client)

    def reattach(self, run_id: str, noted: Mapping[str, Any], jobs: list[int]) -> list[JobOutcome]:
        try:
            status = str(self.client.get_job_info(run_id).status)
        except RuntimeError as exc:
            log.warning(
                f"Ray job {run_id}, which an earlier run of this sweep submitted (or "
                f"tried to), is not on the cluster at {self.dashboard.address} ({exc}): its "
                "jobs run again"
            )
            return []
        log.info(
            f"Re-attaching to Ray job {run_id} ({status}), submitted by an earlier run of "
            f"this sweep for jobs {nums(jobs)}: its log from the start follows, then its "
            "results come home"
        )
        with scratch_dir(SCRATCH) as tmp:
            # Stopped or failed (no returns): what finished has its record.
            returns = _follow_home(
                self.client, self.dashboard, run_id, self.settings, self.book, tmp
            )
            home = self.settings.sync_down.target(self.book.sweep_dir)
            return detached.outcomes_home(returns, home, self.book, jobs)


def _run_as_ray_job(
    session: "Session",
    book: SweepBook,
    current: Batch,
    dashboard: Dashboard,
    client: Any,
) -> list[JobOutcome]:
    settings = session.settings_as(JobsSettings)
    submission_id = _submission_id(session.config, current)
    with scratch_dir(SCRATCH) as tmp:
        package = tmp / "package"
        _stage(session, book, current, settings, package, submission_id)
        _check_upload_size(package)
        runtime_env = _runtime_env(settings, package, settings.sync_up.source_dir is not None)
        entrypoint = ray_job_entrypoint(
            settings.entrypoint_python, f"-m {DRIVER_MODULE} jobs {JOB_SPEC} {PACK_PLAN}"
        )
        # Noted before it exists: a launcher killed right after the submission
        # leaves a Ray job that a resume must find.
        note_detached_run(
            book.sweep_dir, SUBMISSIONS, submission_id, [job.idx for job in current.to_run]
        )
        resources = {
            "entrypoint_num_cpus": settings.entrypoint_num_cpus,
            "entrypoint_num_gpus": settings.entrypoint_num_gpus,
            "entrypoint_memory": settings.entrypoint_memory,
            "entrypoint_resources": settings.entrypoint_resources,
        }
        try:
            _submit(
                client,
                dashboard.address,
                float(settings.agent_wait_s),
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                **without_nulls(resources),
            )
        except OSError as exc:  # requests' ConnectionError: the upload or the submission
            raise LostDashboardError(
                f"Lost the dashboard at {dashboard.address} while submitting the sweep as Ray "
                f"job {submission_id} ({exc}). When it is reachable again, "
                f"{book.resume_hint()} submits it again (or follows it, if it got there)"
            ) from exc
        log.info(
            f"Submitted the sweep as Ray job {submission_id} to {dashboard.address}; "
            f"follow it with `ray job logs -f {submission_id} --address {dashboard.address}`. "
            "If this process ends or loses the dashboard, the sweep goes on on the cluster: "
            f"{book.resume_hint()} follows it again and brings its results home"
        )
        returns = _follow_home(client, dashboard, submission_id, settings, book, tmp)
        if returns is None:
            raise _no_results(client, dashboard, submission_id, "")
        jobs = [job.idx for job in current.to_run]
        home = settings.sync_down.target(book.sweep_dir)
        return detached.outcomes_home(returns, home, book, jobs)


def _no_results(client: Any, dashboard: Dashboard, submission_id: str, logs: str) -> DriverError:
    """Why the Ray job ended without the jobs' results, from its status, its
    message and its log (a module the cluster's Python lacks is named)."""
    status = _wait_end(client, submission_id, 60)
    message = str(client.get_job_info(submission_id).message or "").strip()
    missing = re.findall(r"ModuleNotFoundError: No module named '([^']+)'", logs or message)
    tried = re.findall(rf"^{PYTHON_MARK}(.*)$", logs, re.MULTILINE)
    python = f"The cluster's Python ({tried[0]})" if tried else "The cluster's Python"
    hint = ""
    if missing:
        hint = (
            f" {python} has no module {missing[-1]!r}. Your own code travels with "
            "hydra.launcher.sync_up.source_dir; packages (the driver needs hydra-core, "
            "omegaconf and cloudpickle, the jobs what the app imports) go in the cluster's "
            "image or in hydra.launcher.runtime_env.pip. The driver runs under the Python "
            "that runs the cluster's Ray, or hydra.launcher.entrypoint_python if set."
        )
    elif tried and re.search(r"(not found|No such file or directory)", logs):
        hint = (
            f" {python} is not there on the head: set hydra.launcher.entrypoint_python to "
            "the path of the Python that runs the cluster's Ray (the one `ray start` ran)."
        )
    said = f" ({message[:300]})" if message else ""
    return DriverError(
        f"Ray job {submission_id} ended {status} without the jobs' results{said}.{hint} "
        f"Its log: `ray job logs {submission_id} --address {dashboard.address}`"
    )


def _follow_home(
    client: Any,
    dashboard: Dashboard,
    submission_id: str,
    settings: JobsSettings,
    book: SweepBook,
    tmp: Path,
) -> Path | None:
    """Follow the Ray job to its end, then bring its pack home (also after
    Ctrl-C, which stops the Ray job first); the returns' path, None if the
    driver wrote none. Raises DriverError (no pack), OutputsNotHomeError,
    LostDashboardError."""
    try:
        logs = _follow_reconnecting(
            client, dashboard, submission_id, float(settings.reconnect_s), book
        )
    except KeyboardInterrupt:
        log.warning(f"Ctrl-C: stopping Ray job {submission_id} (its jobs are cancelled)")
        client.stop_job(submission_id)
        _wait_end(client, submission_id, float(settings.stop_wait_s) + 30)
        where = _pack_location(client.get_job_logs(submission_id))
        _home_and_clean(client, dashboard, submission_id, where, settings, book, tmp)
        raise
    where = _pack_location(logs)
    if where is None:  # the job ended without one: its last words
        logs = client.get_job_logs(submission_id)
        where = _pack_location(logs)
    if where is None:  # its driver ended before packing anything
        note_detached_run_home(
            book.sweep_dir, SUBMISSIONS, submission_id
        )  # nothing to fetch: a resume runs its jobs anew
        raise _no_results(client, dashboard, submission_id, logs)
    return _home_and_clean(client, dashboard, submission_id, where, settings, book, tmp)


def _home_and_clean(
    client: Any,
    dashboard: Dashboard,
    submission_id: str,
    where: Mapping[str, Any] | None,
    settings: JobsSettings,
    book: SweepBook,
    tmp: Path,
) -> Path | None:
    """Bring the pack home, note it, then remove the cluster's copies."""
    returns = _bring_pack_home(dashboard, submission_id, where, settings.sync_down, book, tmp)
    note_detached_run_home(book.sweep_dir, SUBMISSIONS, submission_id)
    assert where is not None  # _bring_pack_home raised otherwise
    _clean_cluster(client, submission_id, where, settings)
    return returns


# Run on the driver's node by a Ray job of its own: removes the given paths.
_REMOVE = (
    "import os, shutil, sys\n"
    "for p in sys.argv[1:]:\n"
    "    if os.path.isdir(p) and not os.path.islink(p): shutil.rmtree(p)\n"
    "    elif os.path.lexists(p): os.remove(p)\n"
)


def _clean_cluster(
    client: Any, submission_id: str, where: Mapping[str, Any], settings: JobsSettings
) -> None:
    """Once everything is home, a small Ray job on the driver's node removes the
    pack and the sweep dir the jobs filled in the Ray job's working dir (the
    other nodes' copies went with the gather). Kept: a sweep dir that holds what
    sync_down left out."""
    paths = [where["pack_path"]] if where.get("pack_path") else []
    sweep = where.get("cluster_sweep")
    if sweep and settings.sync_down.filtered:
        log.info(
            f"The sweep dir on the cluster ({sweep}, node {where['node_ip']}) is kept: it "
            "holds what sync_down's include/exclude left out"
        )
    elif sweep:
        paths.append(sweep)
    if not paths:
        return
    cleanup_id = f"{submission_id}-cleanup"
    try:
        client.submit_job(
            entrypoint=ray_job_entrypoint(
                settings.entrypoint_python, shlex.join(["-c", _REMOVE, *paths])
            ),
            submission_id=cleanup_id,
            # Where the driver ran: its node's own resource.
            entrypoint_resources={f"node:{where['node_ip']}": 0.001},
        )
    except (RuntimeError, OSError) as exc:
        log.warning(
            f"Could not remove the sweep's copy on the cluster ({exc}): {', '.join(paths)} "
            f"stay on node {where['node_ip']}"
        )
        return
    log.info(
        f"Everything is home: removing the sweep's copy on the cluster (Ray job {cleanup_id}, "
        f"node {where['node_ip']}): {', '.join(paths)}"
    )


# In the sweep's record dir: each Ray job this sweep submitted (see `detached_runs`).
SUBMISSIONS = "ray_jobs.json"


# A cluster just started (or a KubeRay head just ready) may not have its job
# agent yet: the dashboard answers 500 "No available agent to submit job".
_NO_AGENT = "No available agent to submit job"


def _submit(client: Any, address: str, wait_s: float, **job: Any) -> None:
    """Upload the package and submit the Ray job, waiting up to `wait_s` for a
    job agent. Raises DriverError for any other refusal (Ray's client raises
    RuntimeError for every answer but 200)."""
    deadline = None  # counted from the first "no agent": the upload before takes its time
    while True:
        try:
            client.submit_job(**job)
            return
        except RuntimeError as exc:
            if _NO_AGENT not in str(exc):
                raise DriverError(
                    f"The dashboard at {address} (hydra.launcher.address) refused the sweep's "
                    f"upload or its submission as Ray job {job['submission_id']}: "
                    f"{str(exc).rstrip('.')}. Nothing runs on the cluster; see the dashboard's "
                    "log (dashboard.log in the head's Ray log dir), then run the same command again"
                ) from None
            deadline = deadline or time.monotonic() + wait_s
            if time.monotonic() >= deadline:
                raise DriverError(
                    f"The cluster's dashboard has no job agent to run the sweep (it said "
                    f"{_NO_AGENT!r} for {wait_s:g} s): a head's dashboard agent "
                    "that did not start (see dashboard_agent.log in its Ray log dir; a port "
                    "taken by another Ray on that machine is a usual cause). A head that "
                    "takes longer to start it: raise hydra.launcher.agent_wait_s"
                ) from None
            log.info("The cluster's job agent is not up yet: submitting again in 2 s")
            time.sleep(2)


def _submission_id(config: DictConfig, current: Batch) -> str:
    """Found again by name: the app, when, and the batch's first job."""
    name = re.sub(r"[^A-Za-z0-9_-]", "_", str(config.hydra.job.name))
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"hydra-{name}-{stamp}-{current.jobs[0].idx}"


def _stage(
    session: "Session",
    book: SweepBook,
    current: Batch,
    settings: JobsSettings,
    package: Path,
    submission_id: str,
) -> None:
    """The Ray job's working dir: the job spec, this plugin, the user's code."""
    package.mkdir()
    stage_plugin(package / PLUGIN_DIR)
    sync = settings.sync_up
    if sync.source_dir is not None:
        source = Path(sync.source_dir).expanduser().resolve()
        cmd = rsync_command(
            f"{source}/",
            f"{package / 'code'}/",
            include=list(sync.include),
            exclude=list(sync.exclude),
        )
        subprocess.run(cmd, check=True)
    # A job whose ray.remote does not resolve is refused here, before the upload.
    code_dir = "code" if sync.source_dir is not None else None
    spec = build_job_spec(session, book, current, code_dir)
    warn_if_script_left_out(spec, package / "code")
    write_job_spec(package / JOB_SPEC, spec, dumps_for_cluster(spec))
    down = settings.sync_down
    name = f"{submission_id}.tar"
    plan = PackPlan(name, spec.sweep_dir, down.include, down.exclude, down.storage)
    plan.write(package / PACK_PLAN)


def _check_upload_size(package: Path) -> None:
    """Refuse, before the upload, a package Ray would refuse after it."""
    files = [(p, p.stat().st_size) for p in package.rglob("*") if p.is_file()]
    total = sum(size for _, size in files)
    if total <= UPLOAD_LIMIT:
        return
    biggest = sorted(files, key=lambda f: -f[1])[:5]
    listed = ", ".join(f"{_shown(p, package)} ({size / 2**20:.1f} MiB)" for p, size in biggest)
    raise ConfigError(
        f"The Ray job's package is {total / 2**20:.0f} MiB, over Ray's upload limit of "
        f"{UPLOAD_LIMIT / 2**20:.0f} MiB; the biggest files: {listed}. Leave out what the jobs "
        "do not need with hydra.launcher.sync_up.exclude (or sync_up.include)"
    )


def _shown(path: Path, package: Path) -> str:
    code = package / "code"
    return str(path.relative_to(code)) if path.is_relative_to(code) else path.name


def _runtime_env(settings: JobsSettings, package: Path, code: bool) -> dict[str, Any]:
    """The Ray job's runtime_env, which every task of the sweep gets: the user's
    (hydra.launcher.runtime_env over hydra.launcher.ray.init.runtime_env), the
    package as working_dir with this plugin and the code on the path, and time
    for a stopped driver to pack what finished."""
    env: dict[str, Any] = {}
    for given in (settings.ray_init.get("runtime_env"), settings.runtime_env):
        if given is not None:
            mine = copy.deepcopy(dict(given))
            env_vars = {**(env.get("env_vars") or {}), **(mine.get("env_vars") or {})}
            env.update(mine)
            env["env_vars"] = env_vars
    env["working_dir"] = str(package)
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    # Relative: each node's copy of the package is its tasks' working dir (Python
    # makes the entries absolute at start, before a job changes dir).
    path = [PLUGIN_DIR, *(["code"] if code else []), env_vars.get("PYTHONPATH", "")]
    env_vars["PYTHONPATH"] = os.pathsep.join(p for p in path if p)
    env_vars.setdefault("RAY_JOB_STOP_WAIT_TIME_S", str(int(settings.stop_wait_s)))
    env["env_vars"] = env_vars
    return env


# After the driver's pack line: how long the jobs' last lines (which Ray's log
# monitor forwards a moment later) may take, before Ray's own shutdown, seconds
# of it, that the launcher need not wait for.
_LAST_LINES_S = 2.0


def _follow_reconnecting(
    client: Any, dashboard: Dashboard, submission_id: str, reconnect_s: float, book: SweepBook
) -> str:
    """`_follow`, made again when the connection to the dashboard drops (a
    port-forward restarted, a network blip): with backoff, for `reconnect_s`
    (hydra.launcher.reconnect_s), showing only the lines not shown yet. Raises
    LostDashboardError when the dashboard stays out of reach."""
    shown = 0
    reconnect = detached.Reconnect(reconnect_s)
    while True:
        try:
            return _follow(client, submission_id, skip=shown)
        except lost_connection() as exc:
            shown = max(shown, getattr(exc, "shown", 0))
            if reconnect.given_up():
                raise LostDashboardError(
                    f"Lost the dashboard at {dashboard.address} while following Ray job "
                    f"{submission_id} ({exc}; tried again for {reconnect_s:g} s, "
                    "hydra.launcher.reconnect_s): the sweep goes on on the cluster. When the "
                    f"dashboard is reachable again, {book.resume_hint()} follows it again and "
                    "brings its results home"
                ) from exc
            log.warning(
                f"Lost the dashboard at {dashboard.address} ({exc}): following Ray job "
                f"{submission_id} again in {reconnect.wait_s:.0f} s"
            )
            reconnect.pause()


def _follow(client: Any, submission_id: str, skip: int = 0) -> str:
    """Stream the job's log here until it ends, or until the driver said where
    its pack is and the last lines came; the log. The first `skip` characters
    were shown by an earlier follow: not again. A dropped connection raises
    (one of `lost_connection()`) with `shown`: how many characters are shown now."""
    seen: list[str] = []
    pending = ""
    received = 0  # characters of the log received so far (those of `seen`)

    async def tail() -> None:
        nonlocal pending, received
        chunks = client.tail_job_logs(submission_id).__aiter__()
        packed = False
        while True:
            try:
                chunk = await asyncio.wait_for(
                    chunks.__anext__(), timeout=_LAST_LINES_S if packed else None
                )
            except (StopAsyncIteration, asyncio.TimeoutError):
                return
            seen.append(chunk)
            pending += chunk[max(0, skip - received) :]
            received += len(chunk)
            *lines, pending = pending.split("\n")
            for line in lines:
                if line.startswith(PACK_MARK):
                    packed = True
                else:
                    sys.stdout.write(line + "\n")
            sys.stdout.flush()

    with warnings.catch_warnings():
        # Ray's client passes aiohttp ssl=None for a verified connection, which
        # aiohttp 3.10+ warns of at every follow: not the user's to fix.
        warnings.filterwarnings("ignore", "ssl=None is deprecated", DeprecationWarning)
        try:
            asyncio.run(tail())
        except lost_connection() as exc:
            # Shown: every complete line (`pending`, the part of a line, is not).
            exc.shown = max(skip, received - len(pending))  # type: ignore[attr-defined]
            raise
    if pending and not pending.startswith(PACK_MARK):
        sys.stdout.write(pending + "\n")
    return "".join(seen)


def _wait_end(client: Any, submission_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = str(client.get_job_status(submission_id))
        if status in _TERMINAL or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def _pack_location(logs: str) -> dict[str, Any] | None:
    for line in reversed(logs.splitlines()):
        if line.startswith(PACK_MARK):
            found = json.loads(line[len(PACK_MARK) :])
            return found if isinstance(found, dict) else None
    return None


def _bring_pack_home(
    dashboard: Dashboard,
    submission_id: str,
    where: Mapping[str, Any] | None,
    sync: SyncDown,
    book: SweepBook,
    tmp: Path,
) -> Path | None:
    """Fetch the pack the driver's line `where` tells of (through the dashboard,
    or from sync_down.storage), check it, unpack the records, the outputs and
    the returns here; the returns' path (None if the driver did not write
    them). Raises OutputsNotHomeError.

    The line comes from the cluster: of it only the node and log file to ask
    the dashboard for, the size, the sha256 and the seal are read. The pack's
    name is the one chosen here, the storage the one configured here; the pack
    is untarred only if its seal verifies with the sweep's key (raises
    Unauthentic otherwise, having extracted and removed nothing)."""
    if where is None:
        raise OutputsNotHomeError(
            "The Ray job's driver did not say where its results are (it ended before "
            "packing them): the jobs' outputs, if any, are on the cluster only"
        )
    name = f"{submission_id}.tar"
    local = tmp / name
    storage = sync.storage if where.get("storage") else None
    try:
        if where.get("storage") and storage is None:
            raise ValueError(
                "the driver says it put the pack in sync_down.storage, and none is configured "
                "here: give the sweep's hydra.launcher.sync_down.storage"
            )
        if storage is not None:
            fetch_checked({**where, "storage": storage, "key": name}, local)
        else:
            download(dashboard, {**where, "file": name}, local)
    except (OSError, ValueError, KeyError) as exc:
        there = (
            f"in {redacted(storage)} as {name}"
            if storage is not None
            else f"in sync_down.storage as {name}"
            if where.get("storage")
            else f"on the cluster's head, in its Ray log dir as {name} "
            f"(node {where.get('node_id')})"
        )
        raise OutputsNotHomeError(
            f"The results did not come home ({exc}): they stay {there}"
        ) from exc
    source = (
        f"{redacted(storage)} (sync_down.storage)"
        if storage is not None
        else f"the dashboard at {dashboard.address}"
    )
    home = sync.target(book.sweep_dir)
    _, returns = detached.unpack_home(book, local, where, source, home, home)
    log.info(f"Brought home the outputs ({where['size'] / 2**20:.1f} MiB pack) to {home}")
    if storage is not None:
        remove_quietly(storage, name)
    return returns
