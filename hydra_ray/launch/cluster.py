"""Launch of the cluster launchers (`ray_aws`, `ray_cluster`): check everything,
get a cluster, ship the job spec and the code, run the engine on the head,
bring the job returns and every job's outputs home."""

import dataclasses
import json
import os
import re
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from hydra_ray.checks.validate import (
    check_launch_preconditions,
    check_provider_access,
    cluster_config_for_ray,
    named_cluster,
    remote_path_problems,
    validate_cluster_config,
)
from hydra_ray.core.errors import ClusterCommandError, DriverError, OutputsNotHomeError
from hydra_ray.core.jobs import JobOutcome
from hydra_ray.core.records import (
    RECORD_DIR,
    move_records_home,
    note_detached_run,
    note_detached_run_home,
    read_record,
    write_record,
)
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.core.settings import ClusterSettings, SyncDown, SyncUp
from hydra_ray.core.wire import (
    FOUND_MARK,
    GATHER_REPORT,
    JOB_SPEC,
    PACK_PLAN,
    PLUGIN_DIR,
    REPORT_MARK,
    RETURNS,
    STATE_MARK,
    STORED,
)
from hydra_ray.driver.protocol import (
    JobSpec,
    PackPlan,
    driver_command,
    driver_state_command,
    follow_command,
    gather_command,
    stage_plugin,
    stored_sidecar,
    sweep_dir_as_given,
    sweep_dir_on_cluster,
    write_job_spec,
)
from hydra_ray.engine.worker import dumps_for_cluster
from hydra_ray.infra.autoscaler import (
    Cluster,
    ClusterLifetime,
    Leftovers,
    RemoteTmp,
    autodown_deadline,
    remote_temp_dir,
)
from hydra_ray.infra.scratch import scratch_dir
from hydra_ray.infra.storage import (
    check_reachable,
    exists,
    fetch,
    fetch_checked,
    remove_quietly,
    storage_problems,
)
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


class OnCluster(skeleton.LaunchPath):
    """The `ray_aws` / `ray_cluster` launchers' hooks (see skeleton.LaunchPath)."""

    def dry_run(
        self, session: "Session", job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        from hydra_ray.launch.plan import dry_run_cluster

        config = session.config
        choice = config.hydra.runtime.choices.get("hydra/launcher", "ray_aws")
        settings = session.settings_as(ClusterSettings)
        dry_run_cluster(session.hydra_context, config, settings, job_overrides, first, str(choice))

    def check(self, session: "Session") -> None:
        """Also the cluster config as Ray will get it, and access to its provider:
        kept as the session's cluster lifetime (no cluster exists yet)."""
        settings = session.settings_as(ClusterSettings)
        storage = settings.sync_down.storage
        check_launch_preconditions(
            settings,
            storage_problems(storage)
            + remote_path_problems(
                settings, sweep_dir_as_given(str(session.config.hydra.sweep.dir))
            ),
        )
        if storage is not None:
            check_reachable(storage)
        cluster_config = named_cluster(
            cluster_config_for_ray(settings), settings, str(session.config.hydra.job.name)
        )
        validate_cluster_config(cluster_config)
        check_provider_access(cluster_config)
        session.lifetime = ClusterLifetime(settings, cluster_config)

    def run_batch(self, session: "Session", book: SweepBook, current: Batch) -> list[JobOutcome]:
        assert session.lifetime is not None
        return detached.run_batch(_OverSsh(session.lifetime, session, book), book, current)


class _OverSsh:
    """The transport of the cluster launchers: commands over ssh and files over
    rsync to the cluster's head, through Ray's cluster launcher."""

    def __init__(self, lifetime: ClusterLifetime, session: "Session", book: SweepBook):
        self.notes = DRIVERS
        self.lifetime = lifetime
        self.session = session
        self.book = book
        self.settings = session.settings_as(ClusterSettings)

    def run(self, remaining: Batch) -> list[JobOutcome]:
        # A job whose ray.remote does not resolve is refused here, before the cluster.
        code_dir = _code_dir(self.settings.sync_up)
        spec = build_job_spec(self.session, self.book, remaining, code_dir)
        return _run_on_cluster(self.lifetime, spec, self.settings, self.book)

    def reattach(self, run_id: str, noted: Mapping[str, Any], jobs: list[int]) -> list[JobOutcome]:
        """From sync_down.storage if the driver put its results there; else from
        the head, following the driver to its end first. Creates no cluster: one
        that is gone is said so."""
        book, settings = self.book, self.settings
        with scratch_dir("hydra-ray-cluster") as local_tmp:
            stored = _from_storage(noted, settings.sync_down, book, local_tmp)
        if stored is not None:
            note_detached_run_home(book.sweep_dir, DRIVERS, run_id)
            return stored
        cluster = state = None
        if self.lifetime.head_runs():
            cluster = self.lifetime.get(
                book.sweep_dir / ".hydra" / "ray_cluster.yaml", restart=False
            )
            state = _driver_state(cluster, run_id)
        if cluster is None or state == "gone":
            log.warning(
                (
                    f"The cluster that ran jobs {nums(jobs)} for an earlier run of this sweep "
                    "is gone"
                    if cluster is None
                    else f"The head has no {run_id} of an earlier run of this sweep (jobs "
                    f"{nums(jobs)})"
                )
                + ": those of them that did not come home run again"
            )
            note_detached_run_home(book.sweep_dir, DRIVERS, run_id)
            return []
        log.info(
            f"Re-attaching to the driver ({state}) an earlier run of this sweep started on "
            f"the cluster's head for jobs {nums(jobs)}: its output from the start follows, "
            "then everything comes home"
        )
        with (
            scratch_dir("hydra-ray-cluster") as local_tmp,
            remote_temp_dir(cluster, run_id) as remote_tmp,
        ):
            try:
                _follow(cluster, run_id, float(settings.reconnect_s), from_start=True)
            except DriverError as exc:  # stopped or failed: what it finished has its record
                log.warning(f"{exc} What it finished comes home; the rest runs again")
            finally:
                returns = _bring_home_from_head(
                    cluster,
                    remote_tmp,
                    self.settings.sync_down,
                    book.sweep_dir,
                    local_tmp,
                    book.key,
                    jobs,
                )
            note_detached_run_home(book.sweep_dir, DRIVERS, run_id)
            home = self.settings.sync_down.home(book.sweep_dir)
            return detached.outcomes_home(returns if returns.is_file() else None, home, book, jobs)


# In the sweep's record dir: each driver this sweep started on a cluster's head,
# by its temp dir there (see `detached_runs`).
DRIVERS = "cluster_drivers.json"


def _run_on_cluster(
    lifetime: ClusterLifetime, spec: JobSpec, settings: ClusterSettings, book: SweepBook
) -> list[JobOutcome]:
    sweep_dir = book.sweep_dir
    sync = settings.sync_down
    jobs = [job.idx for job in spec.jobs]
    with scratch_dir("hydra-ray-cluster") as local_tmp:
        spec_file = local_tmp / JOB_SPEC
        write_job_spec(spec_file, spec, dumps_for_cluster(spec))
        log.info(f"Pickle for jobs: {spec_file}")
        cluster = lifetime.get(sweep_dir / ".hydra" / "ray_cluster.yaml")
        with remote_temp_dir(cluster) as remote_tmp:
            _ship_plugin(cluster, remote_tmp.path, local_tmp)
            _sync_up(cluster, settings.sync_up, remote_tmp.path, local_tmp)
            warn_if_script_left_out(spec, local_tmp / "code")
            cluster.rsync_up(str(spec_file), f"{remote_tmp.path}/{JOB_SPEC}")
            stored = _plan_storage(cluster, sync, spec.sweep_dir, remote_tmp.path, local_tmp)
            # Noted before it starts: a launcher killed right after leaves a driver
            # that a resume must find.
            note_detached_run(sweep_dir, DRIVERS, remote_tmp.path, jobs, more=stored)
            try:
                cluster.run(driver_command(remote_tmp.path, spec.code_dir))
                log.info(
                    "Running the jobs from the cluster's head, in a driver that goes on if "
                    f"this process or its connection goes: then {book.resume_hint()} "
                    "follows it again and brings everything home"
                )
                if stored:
                    log.info(
                        "As the batch ends, its results also go to sync_down.storage="
                        f"{redacted(stored['storage'])}: if nobody brings them home from the "
                        "head, the resume command fetches them there"
                        + (", and the cluster tears itself down" if cluster.autodown else "")
                    )
                elif cluster.autodown is not None:
                    log.info(
                        "If nobody brings them home, the results wait on the head until the "
                        f"cluster has been idle for {cluster.autodown.minutes:g} min after the "
                        f"driver ends (not before {autodown_deadline(cluster)}): then it tears "
                        "itself down with them (hydra.launcher.autodown_minutes)"
                    )
                _follow(cluster, remote_tmp.path, float(settings.reconnect_s), from_start=True)
            finally:
                # Whatever finished comes home, also when the driver failed or was stopped.
                returns = _bring_home_from_head(
                    cluster,
                    remote_tmp,
                    sync,
                    sweep_dir,
                    local_tmp,
                    book.key,
                    jobs=jobs,
                )
            note_detached_run_home(sweep_dir, DRIVERS, remote_tmp.path)
            if stored:
                _remove_stored(str(sync.storage), stored["key"])
            return detached.outcomes_home(returns, sync.home(sweep_dir), book, jobs)


def _plan_storage(
    cluster: Cluster, sync: SyncDown, cluster_sweep: str, remote_tmp: str, local_tmp: Path
) -> dict[str, str]:
    """With sync_down.storage: the plan that has the driver put its results
    there (PACK_PLAN, in its working dir); where they will be, to note (the
    storage without its credentials: a resume reads the configured one). The
    plan goes as a file, 0600, as the job spec does: the storage's URI may hold
    credentials, which no command line may."""
    if sync.storage is None:
        return {}
    key = f"{cluster.name}-{Path(remote_tmp).name}.tar"
    source = sync.source_dir
    plan = PackPlan(
        name=key,
        sweep_dir=cluster_sweep,
        include=sync.include,
        exclude=sync.exclude,
        storage=sync.storage,
        outputs_dir=None if source is None else os.path.join("~", source),
    )
    plan.write(local_tmp / PACK_PLAN)
    cluster.rsync_up(str(local_tmp / PACK_PLAN), f"{remote_tmp}/{PACK_PLAN}")
    return {"storage": str(redacted(sync.storage)), "key": key}


def _remove_stored(storage: str, key: str) -> None:
    """The storage's copy of results that came home (from the head or from it)."""
    remove_quietly(storage, key, stored_sidecar(key))


# The name of a pack in the storage, as _plan_storage makes it (nothing that
# leads out of the storage's prefix).
_PACK_NAME = re.compile(r"[A-Za-z0-9_.-]+\.tar")


def _from_storage(
    noted: Mapping[str, Any], sync: SyncDown, book: SweepBook, local_tmp: Path
) -> list[JobOutcome] | None:
    """The outcomes of a driver that put its results in sync_down.storage (its
    cluster may be gone), brought home from there; None if they are not there
    whole (the driver did not end, or could not store them). The storage is
    the configured one, the pack's name the one noted here at launch; of the
    file beside the pack only its size, sha256 and seal are read, and the pack
    is untarred only if its seal verifies with the sweep's key (raises
    Unauthentic otherwise, leaving the storage as it is)."""
    if not noted.get("storage"):
        return None
    key = str(noted.get("key"))
    if not _PACK_NAME.fullmatch(key):
        log.warning(f"{DRIVERS} notes a pack {key!r}, not a name this launcher makes: not fetched")
        return None
    jobs = [int(i) for i in noted.get("jobs", [])]
    if sync.storage is None:
        log.warning(
            f"The driver of jobs {nums(jobs)} put its results in a sync_down.storage, and "
            "none is configured now: give the sweep's hydra.launcher.sync_down.storage to "
            "fetch them from there"
        )
        return None
    storage = sync.storage
    try:
        if not exists(storage, stored_sidecar(key)):
            return None
        fetch(storage, stored_sidecar(key), local_tmp / STORED)
        said = json.loads((local_tmp / STORED).read_text())
        where = {
            "storage": storage,
            "key": key,
            **{k: said.get(k) for k in ("size", "sha256", "seal")},
        }
        fetch_checked(where, local_tmp / key)
    except (OSError, ValueError, AttributeError) as exc:
        log.warning(f"Could not fetch the results from {redacted(storage)} as {key}: {exc}")
        return None
    home = sync.home(book.sweep_dir)
    source = f"{redacted(storage)} (sync_down.storage)"
    target = sync.target(book.sweep_dir)
    idxs, returns = detached.unpack_home(book, local_tmp / key, where, source, target, home)
    log.info(f"Brought home the results of jobs {nums(idxs)} from {redacted(storage)}")
    _remove_stored(storage, key)
    return detached.outcomes_home(returns, home, book, idxs)


def _code_dir(sync: SyncUp) -> str | None:
    """Where the synced code lives on the head: target_dir, or `code` in the remote
    temp dir (relative paths are relative to it: the head driver runs there)."""
    if sync.source_dir is None:
        return None
    return sync.target_dir if sync.target_dir is not None else "code"


def _ship_plugin(cluster: Cluster, remote_tmp: str, local_tmp: Path) -> None:
    """This plugin's own source (and rich) to the head's PLUGIN_DIR."""
    staged = local_tmp / PLUGIN_DIR
    stage_plugin(staged)
    cluster.rsync_up(f"{staged}/", f"{remote_tmp}/{PLUGIN_DIR}/")


def _sync_up(cluster: Cluster, sync: SyncUp, remote_tmp: str, local_tmp: Path) -> None:
    """rsync the user's code to the head, filtered by include/exclude; the jobs on
    every node get it on their sys.path."""
    code_dir = _code_dir(sync)
    if code_dir is None:
        return
    assert sync.source_dir is not None  # _code_dir said so
    source = Path(sync.source_dir).expanduser().resolve()
    target = code_dir if code_dir.startswith("/") else f"{remote_tmp}/{code_dir}"
    # Filter here with rsync's own include/exclude semantics, then send what is left.
    staged = local_tmp / "code"
    subprocess.run(
        rsync_command(f"{source}/", f"{staged}/", include=sync.include, exclude=sync.exclude),
        check=True,
    )
    cluster.run(f"mkdir -p {shlex.quote(target)}")
    cluster.rsync_up(f"{staged}/", f"{target}/")
    log.info(
        f"Synced up {source} to the head's {target} "
        f"(include={sync.include}, exclude={sync.exclude})"
    )


def _follow(cluster: Cluster, remote_tmp: str, reconnect_s: float, *, from_start: bool) -> None:
    """Show the driver's output until it ends. A connection to the head that
    drops while the driver runs is made again (its output from then on), for up
    to `reconnect_s` (hydra.launcher.reconnect_s). Raises DriverError when the
    driver failed or was killed, or the head stayed out of reach (the driver may
    still run: the resume command follows it)."""
    reconnect = detached.Reconnect(reconnect_s)
    while True:
        try:
            cluster.run(follow_command(remote_tmp, from_start=from_start))
            return
        except ClusterCommandError as exc:
            try:
                state = _driver_state(cluster, remote_tmp)
            except ClusterCommandError:
                state = "unreachable"
            if state.startswith(("ended", "killed", "gone")):
                raise DriverError(
                    f"The driver on the cluster's head failed ({exc}); its output is above. "
                    "Outputs of the jobs that finished were synced down."
                ) from exc
            if reconnect.given_up():
                raise DriverError(
                    f"Lost the connection to the cluster's head for {reconnect_s:g} s "
                    f"(hydra.launcher.reconnect_s; {exc}); the driver there may still run"
                ) from exc
            log.warning(
                f"Lost the driver's output ({exc}); the driver is {state}: "
                f"following it again in {reconnect.wait_s:.0f} s"
            )
            reconnect.pause()
            from_start = False


def _driver_state(cluster: Cluster, remote_tmp: str) -> str:
    """`running`, `ended RC`, `killed` or `gone` (see driver_state_command)."""
    out = cluster.run(driver_state_command(remote_tmp), with_output=True)
    for line in out.splitlines():
        if line.startswith(STATE_MARK):
            return line[len(STATE_MARK) :].strip()
    raise ClusterCommandError(f"no driver state in the head's answer: {out!r}")


@dataclass(frozen=True)
class _Transfer:
    """An rsync from the head to this machine, and the command that does it by hand."""

    what: str
    source: str
    target: Path

    def run(self, cluster: Cluster) -> None:
        self.target.mkdir(parents=True, exist_ok=True)
        cluster.rsync_down(f"{self.source}/", f"{self.target}/")

    def command(self, cluster: Cluster) -> str:
        config = str(cluster.config_file.resolve())
        return shlex.join(
            ["ray", "rsync-down", config, f"{self.source}/", f"{self.target.resolve()}/"]
        )


def _bring_home_from_head(
    cluster: Cluster,
    remote_tmp: RemoteTmp,
    sync: SyncDown,
    sweep_dir: Path,
    local_tmp: Path,
    key: bytes,
    jobs: Sequence[int] = (),
) -> Path:
    """Bring home, in this order, the jobs' records (small; resume decides from
    them), the returns (the sweeper's results) and the outputs; return where the
    returns are (absent if the driver did not finish).

    The one place that decides what to keep: when the outputs did not all reach
    the head, or a transfer fails or is interrupted (Ctrl-C, SIGTERM, SIGHUP),
    nothing is deleted: the cluster and the head's temp dir are kept, and the
    cluster session prints the commands that finish the job."""
    returns = local_tmp / RETURNS
    head_sweep = _head_sweep_dir(remote_tmp.path, sweep_dir)
    records = _Transfer("the jobs' records", f"{head_sweep}/{RECORD_DIR}", sweep_dir / RECORD_DIR)
    target = sync.target(sweep_dir)
    source = sync.source_dir if sync.source_dir is not None else head_sweep
    outputs = _Transfer("the outputs", source, target)
    pending = [records, outputs]
    # Until the gather is known to have ended: outputs may still be on other nodes.
    left = "; outputs of jobs on other nodes may not be on the head yet"
    try:
        left, on_nodes = _gathered(cluster, remote_tmp.path, sweep_dir)
        cluster.run(f"mkdir -p {shlex.quote(records.source)}")
        records.run(cluster)
        pending.remove(records)
        home = sync.home(sweep_dir)
        if home is not None:  # the records say where the jobs wrote on the head: now here
            move_records_home(sweep_dir, jobs, sweep_dir_on_cluster(str(sweep_dir)), home, key)
        _mark_outputs_left(sweep_dir, jobs, on_nodes, head_sweep, home, key)
        if _head_has(cluster, f"{remote_tmp.path}/{RETURNS}"):
            cluster.rsync_down(f"{remote_tmp.path}/{RETURNS}", str(returns))
        log.info(f"Bringing home the outputs: the head's {source} to {target}")
        if sync.filtered:
            # Filter on the head, so that only what is wanted crosses the network.
            outputs = _Transfer("the outputs", f"{remote_tmp.path}/down", target)
            pending = [outputs]
            filter_cmd = rsync_command(
                f"{source}/",
                f"{outputs.source}/",
                include=sync.include,
                exclude=sync.exclude,
            )
            cluster.run(f"mkdir -p {shlex.quote(outputs.source)} && {shlex.join(filter_cmd)}")
        outputs.run(cluster)
        pending.remove(outputs)
    except (ClusterCommandError, OSError) as exc:  # OSError: the local target
        _keep(cluster, remote_tmp, sweep_dir, pending, f"{exc}{left}", gather=bool(left))
        raise OutputsNotHomeError(
            f"{' and '.join(t.what for t in pending)} did not come home ({exc}); the cluster "
            "is kept with them, and the commands that bring them home are above"
        ) from exc
    except KeyboardInterrupt:
        why = f"Ctrl-C interrupted the transfers home{left}"
        _keep(cluster, remote_tmp, sweep_dir, pending, why, gather=bool(left), interrupted=True)
        raise
    except SystemExit:
        why = f"a signal stopped the transfers home{left}"
        _keep(cluster, remote_tmp, sweep_dir, pending, why, gather=bool(left))
        raise
    log.info(
        f"Synced down the head's {outputs.source} to {target} "
        f"(include={sync.include}, exclude={sync.exclude})"
    )
    if left:
        _keep(cluster, remote_tmp, sweep_dir, [outputs], left.lstrip("; "), gather=True)
        raise OutputsNotHomeError(
            f"Not every job's outputs came home: {left.lstrip('; ')}; the cluster is kept "
            "with them, and the commands that bring them home are above"
        )
    return returns


def _keep(
    cluster: Cluster,
    remote_tmp: RemoteTmp,
    sweep_dir: Path,
    pending: list[_Transfer],
    what: str,
    *,
    gather: bool,
    interrupted: bool = False,
) -> None:
    remote_tmp.keep()
    commands = [t.command(cluster) for t in pending]
    if gather:
        # First onto the head what is still on other nodes.
        gather_cmd = gather_command(remote_tmp.path, Path(sweep_dir_on_cluster(str(sweep_dir))))
        config = str(cluster.config_file.resolve())
        commands.insert(0, shlex.join(["ray", "exec", config, gather_cmd]))
    cluster.keep_for(Leftovers(what=what, commands=commands, interrupted=interrupted))


def _gathered(
    cluster: Cluster, remote_tmp: str, sweep_dir: Path
) -> tuple[str, list[dict[str, Any]]]:
    """Make sure every node's outputs are on the head: the driver's gather report
    says so, or the driver did not finish (or not its gather) and `gather` runs
    (it stops the driver if it still runs). Returns what is still on other
    nodes ("; ...", or "" when everything is on the head), and the report's
    entries of the nodes that kept them ({"node", "paths", ...})."""
    report = _gather_report(cluster, remote_tmp)
    if report is None or not report.get("complete"):
        log.warning("Gathering the outputs of the jobs that finished on the cluster's nodes")
        try:
            cluster.run(gather_command(remote_tmp, Path(sweep_dir_on_cluster(str(sweep_dir)))))
        except ClusterCommandError as exc:
            log.error(f"Could not gather the outputs on the cluster's nodes: {exc}")
        report = _gather_report(cluster, remote_tmp)
    if report is None:
        return "; the outputs on the cluster's other nodes could not be gathered onto the head", []
    if not report.get("complete"):
        entries = [e for e in report.get("left", []) if isinstance(e, dict)]
        nodes = ", ".join(
            f"{entry.get('node')} ({', '.join(map(str, entry.get('paths', [])))})"
            for entry in entries
        )
        return f"; outputs are still on other nodes of the cluster: {nodes or 'unknown'}", entries
    return "", []


def _mark_outputs_left(
    sweep_dir: Path,
    jobs: Sequence[int],
    on_nodes: list[dict[str, Any]],
    head_sweep: str,
    home: Path | None,
    key: bytes,
) -> None:
    """The records, and so the summary, of the jobs whose outputs stayed on a
    node say where they are (a job that succeeded there is not all home)."""
    where: dict[str, str] = {}
    for entry in on_nodes:
        for path in entry.get("paths", []):
            rel = os.path.relpath(str(path), head_sweep)
            if not rel.startswith(".."):
                where[rel] = f"on node {entry.get('node')}: {path}"
    for idx in jobs if where else ():
        outcome = read_record(sweep_dir, idx, key)
        if outcome is None or outcome.job_dir is None:
            continue
        job_dir = outcome.job_dir
        base = str(home) if home is not None and Path(job_dir).is_relative_to(home) else head_sweep
        rel = os.path.relpath(job_dir, base)
        if rel in where:
            write_record(sweep_dir, dataclasses.replace(outcome, outputs_left=where[rel]), key)


def _gather_report(cluster: Cluster, remote_tmp: str) -> dict[str, Any] | None:
    path = shlex.quote(f"{remote_tmp}/{GATHER_REPORT}")
    out = cluster.run(
        f'if [ -f {path} ]; then echo "{REPORT_MARK}$(cat {path})"; fi', with_output=True
    )
    for line in out.splitlines():
        if line.startswith(REPORT_MARK):
            try:
                report = json.loads(line[len(REPORT_MARK) :])
            except json.JSONDecodeError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _head_has(cluster: Cluster, path: str) -> bool:
    out = cluster.run(
        f"if [ -f {shlex.quote(path)} ]; then echo {FOUND_MARK}; fi", with_output=True
    )
    return FOUND_MARK in out.split()


def _head_sweep_dir(remote_tmp: str, sweep_dir: Path) -> str:
    """The sweep dir on the head: always in the launch's temp dir there."""
    return f"{remote_tmp}/{sweep_dir_on_cluster(str(sweep_dir))}"
