"""Launch of the `ray_jobs` launcher: each batch of the sweep is one Ray job,
submitted through the cluster's dashboard (Ray's Jobs API). Its working_dir
holds the user's code, this plugin and the job spec; its driver is the head
driver the cluster launchers run; the results and outputs come home as one
file served by the dashboard's log API. Nothing here needs SSH or the GCS port."""

import asyncio
import dataclasses
import ipaddress
import json
import math
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import urllib.parse
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from hydra_ray.checks.validate import (
    plain_dict,
    reconnect_problems,
    refuse,
    source_dir_problems,
    sweep_problems,
    without_nulls,
)
from hydra_ray.core.errors import ConfigError, DriverError, LostDashboardError, OutputsNotHomeError
from hydra_ray.core.jobs import INTERRUPTED, JobOutcome
from hydra_ray.core.records import (
    detached_runs,
    move_records_home,
    moved_home,
    note_detached_run,
    note_detached_run_home,
    read_record,
)
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.driver.protocol import (
    BUNDLE_MARK,
    BUNDLE_PLAN,
    DRIVER_MODULE,
    JOB_SPEC,
    LOWEST_CLUSTER_RAY_TEXT,
    PLUGIN_DIR,
    PYTHON_MARK,
    load_outcomes,
    older_than_lowest_ray,
    ray_job_entrypoint,
    stage_plugin,
    sweep_dir_on_cluster,
    unpack_bundle,
    verify_pack,
    write_job_spec,
)
from hydra_ray.engine.worker import dumps_for_cluster
from hydra_ray.infra.scratch import scratch_dir
from hydra_ray.infra.storage import check_pack, fetch_checked, remove_quietly, storage_problems
from hydra_ray.infra.sync import rsync_command
from hydra_ray.launch import skeleton
from hydra_ray.launch.sweep import Batch, SweepBook, build_job_spec, warn_if_script_left_out

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import Session

log = redacting_logger(__name__)

# This machine's scratch dirs (see `infra.scratch`): the package, a pack coming home.
SCRATCH = "hydra-ray-jobs"
# Ray refuses a larger working_dir upload (HTTP 413); 100 MiB today.
UPLOAD_LIMIT = 100 * 2**20
_TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def _lost() -> tuple[type[BaseException], ...]:
    """What a broken connection to the dashboard raises while a job's log is
    followed: Ray's client (RuntimeError on an abnormal close), aiohttp, the socket."""
    import aiohttp

    return (RuntimeError, OSError, asyncio.TimeoutError, aiohttp.ClientError)


@dataclass
class Dashboard:
    """Where and how to reach the cluster's dashboard. `token` (found where Ray's
    clients find it; `token_from` says where) goes with every request only once
    the dashboard has asked for one (401/403 without it), or at once under
    RAY_AUTH_MODE=token; over plain http to another machine, only with
    `token_over_http`. A token in the user's own headers goes as they say."""

    address: str
    user_headers: dict[str, str]
    verify: bool | str
    token: str | None = None
    token_from: str | None = None
    token_over_http: bool = False
    sends_token: bool = False

    @property
    def headers(self) -> dict[str, str]:
        """Every request's headers: the user's, and the token once it is sent."""
        if self.sends_token and self.token is not None:
            return {**self.user_headers, "Authorization": f"Bearer {self.token}"}
        return dict(self.user_headers)

    def client(self) -> Any:
        """Ray's client, its first request made: a dashboard that cannot be
        reached, or that refuses the token, is named here, before any upload.
        Raises ConfigError."""
        if self.token is not None and os.environ.get("RAY_AUTH_MODE") == "token":
            self._send_token()
        try:
            client = self._connect()
        except _AsksForToken as asked:
            if self.token is None or self.sends_token:
                raise ConfigError(self._refused(asked.said)) from None
            self._send_token()
            try:
                client = self._connect()
            except _AsksForToken as again:
                raise ConfigError(self._refused(again.said)) from None
        self._check_ray_version()
        return client

    def _connect(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        from hydra_ray.infra.connect import auth_error

        AuthenticationError = auth_error()

        try:
            return JobSubmissionClient(self.address, headers=self.headers, verify=self.verify)
        except AuthenticationError as exc:
            raise _AsksForToken(str(exc)) from None
        except ConnectionError:
            raise ConfigError(
                f"Cannot reach the dashboard at {self.address} (hydra.launcher.address): is "
                "the cluster up, and the port-forward (`kubectl port-forward "
                "svc/<cluster>-head-svc 8265:8265`) running?"
            ) from None
        except (RuntimeError, OSError) as exc:  # an HTTP answer, not the Jobs API's
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403):  # a Ray without token authentication's client
                raise _AsksForToken(f"HTTP {status}") from None
            raise ConfigError(
                f"{self.address} (hydra.launcher.address) answered, but not as a Ray "
                f"dashboard's Jobs API ({exc}): give the dashboard's port (8265 by default)"
            ) from None

    def _send_token(self) -> None:
        """From now on the token goes with every request. Raises ConfigError where
        it would cross the network in clear without the user's say-so."""
        url = urllib.parse.urlsplit(self.address)
        if url.scheme == "http" and not _loopback(url.hostname) and not self.token_over_http:
            raise ConfigError(
                f"The dashboard at {self.address} asks for a token, and this machine's (from "
                f"{self.token_from}) would cross the network in clear (http to another "
                "machine). Reach the dashboard over https, or through a port-forward to "
                "127.0.0.1, or set hydra.launcher.token_over_http=true to send it anyway"
            )
        self.sends_token = True

    def _check_ray_version(self) -> None:
        """Refuse a cluster whose Ray is older than the lowest this plugin works
        with, as the dashboard's /api/version tells it. Raises ConfigError."""
        import requests

        try:
            answer = requests.get(
                f"{self.address}/api/version", headers=self.headers, verify=self.verify, timeout=30
            )
            running = str(answer.json().get("ray_version") or "")
        except (OSError, ValueError, AttributeError):
            return  # Ray's client took this dashboard; a late blip is no reason to refuse
        if older_than_lowest_ray(running):
            lowest = LOWEST_CLUSTER_RAY_TEXT
            raise ConfigError(
                f"The cluster at {self.address} (hydra.launcher.address) runs Ray {running}: "
                f"the ray_jobs launcher needs Ray {lowest} or later on the cluster (its driver "
                f"and the dashboard's APIs it uses). Use a cluster image with Ray >= {lowest}, "
                "ideally the Ray of this machine"
            )

    def _refused(self, said: str) -> str:
        fix = (
            "Set RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head; "
            "on KubeRay, the RayCluster's auth secret), or write it to ~/.ray/auth_token, or "
            "give +hydra.launcher.headers.Authorization='Bearer <token>'"
        )
        if self.token_from is None:
            return (
                f"The dashboard at {self.address} requires a token (Ray's token "
                f"authentication) and none was found to send. {fix}"
            )
        reason = "refused" if "403" in said or "Invalid" in said else f"did not take ({said})"
        return (
            f"The dashboard at {self.address} {reason} the token from {self.token_from}: it is "
            f"not this cluster's. {fix}"
        )


class _AsksForToken(Exception):
    """The dashboard answered 401 or 403: it wants a token, or another."""

    def __init__(self, said: str):
        super().__init__(said)
        self.said = said


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:  # a name: it may resolve to anywhere
        return False


# Whose value is the user's own token: sent as it is, no other is added.
_AUTH_HEADERS = ("authorization", "x-ray-authorization")


def _found_token() -> tuple[str | None, str | None]:
    """The bearer token Ray's own clients would send, found as they find it
    (RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token),
    whatever RAY_AUTH_MODE says, and where it was found; (None, None) if none.
    Raises ConfigError."""
    token, source = os.environ.get("RAY_AUTH_TOKEN", "").strip(), "RAY_AUTH_TOKEN"
    if not token:
        named = os.environ.get("RAY_AUTH_TOKEN_PATH")
        path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
        source = f"RAY_AUTH_TOKEN_PATH={named}" if named else str(path)
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            if named:
                raise ConfigError(
                    f"RAY_AUTH_TOKEN_PATH={named}: no such file. Point it at the file that "
                    "holds the cluster's token, or unset it"
                ) from None
        except OSError as exc:
            raise ConfigError(f"Cannot read the token file {path} ({exc})") from None
    return (token, source) if token else (None, None)


def dashboard_address(settings: DictConfig) -> str:
    """hydra.launcher.address, else RAY_API_SERVER_ADDRESS, else an http(s)
    RAY_ADDRESS (as `ray job submit`). Raises ConfigError."""
    address = settings.address
    key = "hydra.launcher.address"
    if address is None:
        for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
            value = os.environ.get(var, "")
            if value.startswith(("http://", "https://")):
                return value.rstrip("/")
        raise ConfigError(
            f"{key} is not set: give the cluster's dashboard, e.g. "
            f"{key}=http://127.0.0.1:8265 (after `kubectl port-forward "
            "svc/<cluster>-head-svc 8265:8265`), or set RAY_API_SERVER_ADDRESS"
        )
    address = str(address)
    if address.startswith("ray://") or not address.startswith(("http://", "https://")):
        raise ConfigError(
            f"{key}={address} is not a dashboard address: the ray_jobs launcher talks to the "
            "dashboard, http(s)://HOST:8265. For a Ray Client (ray://HOST:10001) or GCS "
            "(HOST:6379) address, use hydra/launcher=ray with "
            "hydra.launcher.ray.init.address=..."
        )
    return address.rstrip("/")


def _dashboard(settings: DictConfig) -> Dashboard:
    if settings.headers is not None and not OmegaConf.is_dict(settings.headers):
        # Its value is likely a secret (a token): not shown.
        raise ConfigError(
            "hydra.launcher.headers is not valid: it is a mapping of header names to values, "
            "e.g. +hydra.launcher.headers.Authorization='Bearer <token>' (or "
            "hydra.launcher.headers='{Authorization: \"Bearer <token>\"}')"
        )
    headers = plain_dict(settings.headers) if settings.headers is not None else {}
    verify = settings.verify
    if not isinstance(verify, (bool, str)):
        raise ConfigError(
            f"hydra.launcher.verify={verify} is not valid: true, false, or a CA bundle's path"
        )
    if isinstance(verify, str) and not os.path.exists(os.path.expanduser(verify)):
        raise ConfigError(
            f"hydra.launcher.verify={verify}: no such CA bundle (file or dir) on this machine. "
            "Give the path of the CA bundle that signed the dashboard's certificate, or true "
            "for the system's CAs"
        )
    verify = os.path.expanduser(verify) if isinstance(verify, str) else verify
    given = {str(k): str(v) for k, v in headers.items()}
    address = dashboard_address(settings)
    if any(k.lower() in _AUTH_HEADERS for k in given):  # the user's own: sent as it is
        return Dashboard(address, given, verify, token_from="hydra.launcher.headers")
    token, token_from = _found_token()
    over_http = bool(settings.get("token_over_http", False))
    return Dashboard(address, given, verify, token, token_from, over_http)


def jobs_problems(settings: DictConfig) -> list[ConfigError]:
    """What the ray_jobs launcher refuses before anything is uploaded."""
    return sweep_problems(settings) + dashboard_problems(settings)


def dashboard_problems(settings: DictConfig) -> list[ConfigError]:
    """The ray_jobs launcher's own keys that cannot work: the address, sync_up."""
    problems: list[ConfigError] = []
    try:
        _dashboard(settings)
    except ConfigError as exc:
        problems.append(exc)
    wait = settings.agent_wait_s
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait < math.inf:
        problems.append(
            ConfigError(
                f"hydra.launcher.agent_wait_s={wait} is not valid: set it to the seconds to "
                "wait for the cluster's job agent to come up (a finite number >= 0)"
            )
        )
    problems += reconnect_problems(settings)
    stop_wait, grace = settings.stop_wait_s, settings.get("stop_grace_s", 10.0)
    numbers = isinstance(grace, (int, float)) and isinstance(stop_wait, (int, float))
    if numbers and stop_wait < grace + 5:
        problems.append(
            ConfigError(
                f"hydra.launcher.stop_wait_s={stop_wait} is too short for "
                f"hydra.launcher.stop_grace_s={grace}: after Ctrl-C, Ray kills the sweep's "
                "driver stop_wait_s after it stops it, before its jobs' grace to save their "
                "work has ended and before it packs what finished. Set stop_wait_s to at "
                f"least {grace + 5:g} (stop_grace_s + 5), or lower stop_grace_s"
            )
        )
    source_dir = settings.sync_up.source_dir
    problems += source_dir_problems(source_dir)
    problems += storage_problems(settings.sync_down.storage)
    if source_dir is not None and shutil.which("rsync") is None:
        problems.append(
            ConfigError("rsync not found on PATH: sync_up filters with it. Install it.")
        )
    return problems


class ThroughDashboard(skeleton.LaunchPath):
    """The `ray_jobs` launcher's hooks (see skeleton.LaunchPath)."""

    def dry_run(
        self, session: "Session", job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        dry_run(session.hydra_context, session.config, job_overrides, first)

    def check(self, session: "Session") -> None:
        """Also that the dashboard (and sync_down.storage) answers, before any upload."""
        settings: DictConfig = session.config.hydra.launcher
        refuse(jobs_problems(settings))
        _check_reachable(settings)

    def run_batch(self, session: "Session", book: SweepBook, current: Batch) -> list[JobOutcome]:
        return _run(session, book, current, _dashboard(session.config.hydra.launcher))


def _check_reachable(settings: DictConfig) -> None:
    """Before the sweep dir is touched: a dashboard out of reach, a token it
    refuses, a sync_down.storage this machine cannot read. Raises ConfigError."""
    if settings.sync_down.storage is not None:
        from hydra_ray.infra.storage import check_reachable

        check_reachable(str(settings.sync_down.storage))
    _dashboard(settings).client()


def _run(
    session: "Session", book: SweepBook, current: Batch, dashboard: Dashboard
) -> list[JobOutcome]:
    """The batch's outcomes: on a resume, first those of a Ray job an earlier run
    of the sweep submitted and did not bring home (it may still run: the
    launcher died, or its connection); then a new Ray job for the rest."""
    client = dashboard.client()
    got = _reattach(session, book, current, dashboard, client) if book.settings.resume else {}
    rest = [job for job in current.to_run if job.idx not in got]
    outcomes = [got[job.idx] for job in current.to_run if job.idx in got]
    if rest:
        remaining = dataclasses.replace(
            current, to_run=rest, already_done=current.already_done + len(outcomes)
        )
        outcomes += _run_as_ray_job(session, book, remaining, dashboard, client)
    return outcomes


def _run_as_ray_job(
    session: "Session",
    book: SweepBook,
    current: Batch,
    dashboard: Dashboard,
    client: Any,
) -> list[JobOutcome]:
    settings = session.config.hydra.launcher
    submission_id = _submission_id(session.config, current)
    with scratch_dir(SCRATCH) as tmp:
        package = tmp / "package"
        _stage(session, book, current, settings, package, submission_id)
        _check_upload_size(package)
        runtime_env = _runtime_env(settings, package, settings.sync_up.source_dir is not None)
        entrypoint = ray_job_entrypoint(
            settings.entrypoint_python, f"-m {DRIVER_MODULE} jobs {JOB_SPEC} {BUNDLE_PLAN}"
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
            "entrypoint_resources": plain_dict(settings.entrypoint_resources)
            if settings.entrypoint_resources is not None
            else None,
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
        return _outcomes_home(returns, settings, book)


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
    settings: DictConfig,
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
        where = _bundle_location(client.get_job_logs(submission_id))
        _home_and_clean(client, dashboard, submission_id, where, settings, book, tmp)
        raise
    where = _bundle_location(logs)
    if where is None:  # the job ended without one: its last words
        logs = client.get_job_logs(submission_id)
        where = _bundle_location(logs)
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
    settings: DictConfig,
    book: SweepBook,
    tmp: Path,
) -> Path | None:
    """Bring the pack home, note it, then remove the cluster's copies."""
    returns = _bring_pack_home(dashboard, submission_id, where, settings, book, tmp)
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
    client: Any, submission_id: str, where: Mapping[str, Any], settings: DictConfig
) -> None:
    """Once everything is home, a small Ray job on the driver's node removes the
    pack and the sweep dir the jobs filled in the Ray job's working dir (the
    other nodes' copies went with the gather). Kept: a sweep dir that holds what
    sync_down left out."""
    paths = [where["pack_path"]] if where.get("pack_path") else []
    sweep = where.get("cluster_sweep")
    down = settings.sync_down
    if sweep and (down.include or down.exclude):
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


def _reattach(
    session: "Session",
    book: SweepBook,
    current: Batch,
    dashboard: Dashboard,
    client: Any,
) -> dict[int, JobOutcome]:
    """The outcomes, by job, of the earlier run's Ray jobs for this batch whose
    results did not come home: each is followed to its end (it may still run)
    and its pack brought home. A job it did not finish is not among them."""
    settings = session.config.hydra.launcher
    wanted = {job.idx for job in current.to_run}
    got: dict[int, JobOutcome] = {}
    for submission_id, noted in detached_runs(book.sweep_dir, SUBMISSIONS).items():
        jobs = {int(i) for i in noted.get("jobs", [])}
        if noted.get("home") or not jobs & wanted:
            continue
        try:
            status = str(client.get_job_info(submission_id).status)
        except RuntimeError as exc:
            log.warning(
                f"Ray job {submission_id}, which an earlier run of this sweep submitted (or "
                f"tried to), is not on the cluster at {dashboard.address} ({exc}): its jobs "
                "run again"
            )
            continue
        log.info(
            f"Re-attaching to Ray job {submission_id} ({status}), submitted by an earlier "
            f"run of this sweep for jobs {', '.join(f'#{i}' for i in sorted(jobs))}: its log "
            "from the start follows, then its results come home"
        )
        with scratch_dir(SCRATCH) as tmp:
            returns = _follow_home(client, dashboard, submission_id, settings, book, tmp)
            if returns is not None:
                outcomes = _outcomes_home(returns, settings, book)
            else:  # stopped or failed: what finished has its record
                found = (read_record(book.sweep_dir, idx, book.key) for idx in sorted(jobs))
                outcomes = [o for o in found if o is not None]
        got.update((o.idx, o) for o in outcomes if o.idx in wanted and o.status != INTERRUPTED)
    return got


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
    settings: DictConfig,
    package: Path,
    submission_id: str,
) -> None:
    """The Ray job's working dir: the job spec, this plugin, the user's code."""
    package.mkdir()
    stage_plugin(package / PLUGIN_DIR)
    sync = settings.sync_up
    if sync.source_dir is not None:
        source = Path(str(sync.source_dir)).expanduser().resolve()
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
    plan = {
        "name": f"{submission_id}.tar",
        "sweep_dir": spec.sweep_dir,
        "include": list(down.include),
        "exclude": list(down.exclude),
        "storage": down.storage,
    }
    (package / BUNDLE_PLAN).write_text(json.dumps(plan))


def dry_run(
    hydra_context: Any, config: DictConfig, job_overrides: Sequence[Sequence[str]], first: int
) -> NoReturn:
    """The dry run of the `ray_jobs` launcher: no request reaches the dashboard."""
    from hydra_ray.launch.plan import Plan, filters_text, plan_sweep, size_text, upload_lines

    plan = Plan("ray_jobs")
    settings = config.hydra.launcher
    plan_sweep(plan, hydra_context, config, job_overrides, first)
    plan.problems += [str(p) for p in dashboard_problems(settings)]
    try:
        address = dashboard_address(settings)
    except ConfigError:
        address = "(none: see the problems)"
    lines = [f"one Ray job per batch, submitted to the dashboard at {address}"]
    up = settings.sync_up
    source = Path(str(up.source_dir)).expanduser().resolve() if up.source_dir else None
    if source is None:
        lines.append("code: none sent (hydra.launcher.sync_up.source_dir is null)")
    elif source.is_dir():
        total = upload_lines(lines, "code", source, up)
        if total > UPLOAD_LIMIT:
            plan.problems.append(
                f"hydra.launcher.sync_up: {size_text(total)} of code is over Ray's upload limit of "
                f"{size_text(UPLOAD_LIMIT)}: leave out what the jobs do not need with "
                "hydra.launcher.sync_up.exclude (the biggest files are listed above)"
            )
    down = settings.sync_down
    lines.append(
        f"back: the records, the returns and the sweep dir's outputs -> "
        f"{down.target_dir or 'the local sweep dir'}{filters_text(down)}"
        + (
            f", as one pack through {down.storage}"
            if down.storage
            else ", as one pack through the dashboard's log API"
        )
    )
    plan.add("Where the jobs run", lines)
    plan.finish()


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


def _runtime_env(settings: DictConfig, package: Path, code: bool) -> dict[str, Any]:
    """The Ray job's runtime_env, which every task of the sweep gets: the user's
    (hydra.launcher.runtime_env over hydra.launcher.ray.init.runtime_env), the
    package as working_dir with this plugin and the code on the path, and time
    for a stopped driver to pack what finished."""
    env: dict[str, Any] = {}
    for node in (settings.ray.init.runtime_env, settings.runtime_env):
        if node is not None:
            mine = plain_dict(node)
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
    lost_since: float | None = None
    wait = 1.0
    while True:
        try:
            return _follow(client, submission_id, skip=shown)
        except _lost() as exc:
            shown = max(shown, getattr(exc, "shown", 0))
            lost_since = lost_since or time.monotonic()
            if time.monotonic() - lost_since > reconnect_s:
                raise LostDashboardError(
                    f"Lost the dashboard at {dashboard.address} while following Ray job "
                    f"{submission_id} ({exc}; tried again for {reconnect_s:g} s, "
                    "hydra.launcher.reconnect_s): the sweep goes on on the cluster. When the "
                    f"dashboard is reachable again, {book.resume_hint()} follows it again and "
                    "brings its results home"
                ) from exc
            log.warning(
                f"Lost the dashboard at {dashboard.address} ({exc}): following Ray job "
                f"{submission_id} again in {wait:.0f} s"
            )
            time.sleep(wait)
            wait = min(wait * 2, 15.0)


def _follow(client: Any, submission_id: str, skip: int = 0) -> str:
    """Stream the job's log here until it ends, or until the driver said where
    its pack is and the last lines came; the log. The first `skip` characters
    were shown by an earlier follow: not again. A dropped connection raises
    (one of `_lost()`) with `shown`: how many characters are shown now."""
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
                if line.startswith(BUNDLE_MARK):
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
        except _lost() as exc:
            # Shown: every complete line (`pending`, the part of a line, is not).
            exc.shown = max(skip, received - len(pending))  # type: ignore[attr-defined]
            raise
    if pending and not pending.startswith(BUNDLE_MARK):
        sys.stdout.write(pending + "\n")
    return "".join(seen)


def _wait_end(client: Any, submission_id: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while True:
        status = str(client.get_job_status(submission_id))
        if status in _TERMINAL or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def _bundle_location(logs: str) -> dict[str, Any] | None:
    for line in reversed(logs.splitlines()):
        if line.startswith(BUNDLE_MARK):
            found = json.loads(line[len(BUNDLE_MARK) :])
            return found if isinstance(found, dict) else None
    return None


def _bring_pack_home(
    dashboard: Dashboard,
    submission_id: str,
    where: Mapping[str, Any] | None,
    settings: DictConfig,
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
    local = tmp / "bundle.tar"
    storage = settings.sync_down.storage if where.get("storage") else None
    try:
        if where.get("storage") and storage is None:
            raise ValueError(
                "the driver says it put the pack in sync_down.storage, and none is configured "
                "here: give the sweep's hydra.launcher.sync_down.storage"
            )
        if storage is not None:
            fetch_checked({**where, "storage": str(storage), "key": name}, local)
        else:
            _download(dashboard, {**where, "file": name}, local)
    except (OSError, ValueError, KeyError) as exc:
        there = (
            f"in {redacted(str(storage))} as {name}"
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
        f"{redacted(str(storage))} (sync_down.storage)"
        if storage is not None
        else f"the dashboard at {dashboard.address}"
    )
    verify_pack(book.key, name, where, source)
    target_dir = _home_dir(settings, book)
    idxs, returns = unpack_bundle(local, tmp / "unpacked", book.sweep_dir, target_dir)
    # The records say where the jobs wrote on the cluster: now they say here.
    move_records_home(
        book.sweep_dir, idxs, sweep_dir_on_cluster(str(book.sweep_dir)), target_dir, book.key
    )
    log.info(f"Brought home the outputs ({where['size'] / 2**20:.1f} MiB pack) to {target_dir}")
    if storage is not None:
        remove_quietly(str(storage), name)
    return returns


def _home_dir(settings: DictConfig, book: SweepBook) -> Path:
    """Where the jobs' outputs come home."""
    target = settings.sync_down.target_dir
    return Path(str(target)) if target is not None else book.sweep_dir


def _outcomes_home(returns: Path, settings: DictConfig, book: SweepBook) -> list[JobOutcome]:
    """The driver's outcomes, with the paths where the jobs' files came home."""
    home = _home_dir(settings, book)
    given = sweep_dir_on_cluster(str(book.sweep_dir))
    return [moved_home(o, given, home) for o in load_outcomes(str(returns), book.key)]


def _download(dashboard: Dashboard, where: Mapping[str, Any], local: Path) -> None:
    """The pack, from the dashboard's log API, checked (size, sha256).

    `format=text` asks for the file as it is: Ray 2.33 to 2.44 put a "1" before
    each chunk otherwise (the framing of `ray logs`); later Rays send the file
    as it is and ignore the parameter."""
    import requests

    query = urllib.parse.urlencode(
        {
            "node_id": where["node_id"],
            "filename": where["file"],
            "lines": -1,
            "timeout": 600,
            "format": "text",
        }
    )
    headers = dict(dashboard.headers)  # the user's, and the token if any
    url = f"{dashboard.address}/api/v0/logs/file?{query}"
    with requests.get(url, stream=True, headers=headers, verify=dashboard.verify, timeout=60) as r:
        if r.status_code != 200:
            raise ValueError(f"the dashboard answered {r.status_code}: {r.text[:300]}")
        with open(local, "wb") as out:
            for chunk in r.iter_content(chunk_size=1 << 20):
                out.write(chunk)
    check_pack(local, where)
