"""Launch of the cluster launchers (`ray_aws`, `ray_cluster`): check everything,
get a cluster, ship the job spec and the code, run the engine on the head,
bring the job returns and every job's outputs home."""

import json
import logging
import os
import shlex
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from omegaconf import DictConfig

from hydra_ray.checks.validate import (
    check_launch_preconditions,
    check_provider_access,
    cluster_config_for_ray,
    named_cluster,
    validate_cluster_config,
)
from hydra_ray.core.errors import ClusterCommandError, DriverError, OutputsNotHomeError
from hydra_ray.core.jobs import JobOutcome
from hydra_ray.core.records import RECORD_DIR, move_records_home, moved_home
from hydra_ray.driver.protocol import (
    GATHER_REPORT,
    JOB_SPEC,
    PLUGIN_DIR,
    RETURNS,
    JobSpec,
    driver_command,
    gather_command,
    load_outcomes,
    stage_plugin,
)
from hydra_ray.engine.worker import dumps_for_cluster
from hydra_ray.infra.autoscaler import (
    Cluster,
    ClusterLifetime,
    Leftovers,
    RemoteTmp,
    remote_temp_dir,
)
from hydra_ray.infra.scratch import scratch_dir
from hydra_ray.infra.sync import rsync_command
from hydra_ray.launch import skeleton
from hydra_ray.launch.sweep import Batch, SweepBook, build_job_spec

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import Session

log = logging.getLogger(__name__)

_REPORT_MARK = "HYDRA_RAY_GATHER_REPORT="
_FOUND = "HYDRA_RAY_FOUND"


class OnCluster(skeleton.LaunchPath):
    """The `ray_aws` / `ray_cluster` launchers' hooks (see skeleton.LaunchPath)."""

    def dry_run(
        self, session: "Session", job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        from hydra_ray.launch.plan import dry_run_cluster

        config = session.config
        choice = config.hydra.runtime.choices.get("hydra/launcher", "ray_aws")
        dry_run_cluster(session.hydra_context, config, job_overrides, first, str(choice))

    def check(self, session: "Session") -> None:
        """Also the cluster config as Ray will get it, and access to its provider:
        kept as the session's cluster lifetime (no cluster exists yet)."""
        settings: DictConfig = session.config.hydra.launcher
        check_launch_preconditions(settings)
        cluster_config = named_cluster(
            cluster_config_for_ray(settings), settings, str(session.config.hydra.job.name)
        )
        validate_cluster_config(cluster_config)
        check_provider_access(cluster_config)
        session.lifetime = ClusterLifetime(settings, cluster_config)

    def run_batch(self, session: "Session", book: SweepBook, current: Batch) -> list[JobOutcome]:
        assert session.lifetime is not None
        settings: DictConfig = session.config.hydra.launcher
        # A job whose ray.remote does not resolve is refused here, before the cluster.
        spec = build_job_spec(session, book, current, _code_dir(settings.sync_up))
        return _run_on_cluster(session.lifetime, spec, settings, book.sweep_dir)


def _run_on_cluster(
    lifetime: ClusterLifetime, spec: JobSpec, settings: DictConfig, sweep_dir: Path
) -> list[JobOutcome]:
    with scratch_dir("hydra-ray-cluster") as local_tmp:
        spec_file = local_tmp / JOB_SPEC
        # It holds the app's config and state: for this user only.
        with open(os.open(spec_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(dumps_for_cluster(spec))
        log.info(f"Pickle for jobs: {spec_file}")
        cluster = lifetime.get(sweep_dir / ".hydra" / "ray_cluster.yaml")
        with remote_temp_dir(cluster) as remote_tmp:
            _ship_plugin(cluster, remote_tmp.path, local_tmp)
            _sync_up(cluster, settings.sync_up, remote_tmp.path, local_tmp)
            cluster.rsync_up(str(spec_file), f"{remote_tmp.path}/{JOB_SPEC}")
            try:
                _run_head_driver(cluster, remote_tmp.path, spec.code_dir)
            finally:
                # Whatever finished comes home, also when the driver failed or was stopped.
                returns = _bring_home_from_head(
                    cluster,
                    remote_tmp,
                    settings.sync_down,
                    sweep_dir,
                    local_tmp,
                    jobs=[job.idx for job in spec.jobs],
                )
            home = _outputs_home(settings.sync_down, sweep_dir)
            outcomes = load_outcomes(str(returns))
            if home is None:
                return outcomes
            return [moved_home(o, spec.sweep_dir, home) for o in outcomes]


def _code_dir(sync: DictConfig) -> str | None:
    """Where the synced code lives on the head: target_dir, or `code` in the remote
    temp dir (relative paths are relative to it: the head driver runs there)."""
    if sync.source_dir is None:
        return None
    return str(sync.target_dir) if sync.target_dir is not None else "code"


def _ship_plugin(cluster: Cluster, remote_tmp: str, local_tmp: Path) -> None:
    """This plugin's own source (and rich) to the head's PLUGIN_DIR."""
    staged = local_tmp / PLUGIN_DIR
    stage_plugin(staged)
    cluster.rsync_up(f"{staged}/", f"{remote_tmp}/{PLUGIN_DIR}/")


def _sync_up(cluster: Cluster, sync: DictConfig, remote_tmp: str, local_tmp: Path) -> None:
    """rsync the user's code to the head, filtered by include/exclude; the jobs on
    every node get it on their sys.path."""
    code_dir = _code_dir(sync)
    if code_dir is None:
        return
    source = Path(str(sync.source_dir)).expanduser().resolve()
    target = code_dir if code_dir.startswith("/") else f"{remote_tmp}/{code_dir}"
    # Filter here with rsync's own include/exclude semantics, then send what is left.
    staged = local_tmp / "code"
    subprocess.run(
        rsync_command(
            f"{source}/", f"{staged}/", include=list(sync.include), exclude=list(sync.exclude)
        ),
        check=True,
    )
    cluster.run(f"mkdir -p {shlex.quote(target)}")
    cluster.rsync_up(f"{staged}/", f"{target}/")
    log.info(
        f"Synced up {source} to the head's {target} "
        f"(include={list(sync.include)}, exclude={list(sync.exclude)})"
    )


def _run_head_driver(cluster: Cluster, remote_tmp: str, code_dir: str | None) -> None:
    cmd = driver_command(remote_tmp, code_dir)
    log.info("Running the jobs from the cluster's head")
    try:
        cluster.run(cmd)
    except ClusterCommandError as exc:
        raise DriverError(
            f"The driver on the cluster's head failed ({exc}); its output is above. "
            "Outputs of the jobs that finished were synced down."
        ) from exc


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


def _outputs_home(sync: DictConfig, sweep_dir: Path) -> Path | None:
    """Where the sweep dir's outputs come home; None if sync_down brings another dir."""
    if sync.source_dir is not None:
        return None
    return Path(str(sync.target_dir)) if sync.target_dir is not None else sweep_dir


def _bring_home_from_head(
    cluster: Cluster,
    remote_tmp: RemoteTmp,
    sync: DictConfig,
    sweep_dir: Path,
    local_tmp: Path,
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
    target = Path(str(sync.target_dir)) if sync.target_dir is not None else sweep_dir
    source = str(sync.source_dir) if sync.source_dir is not None else head_sweep
    outputs = _Transfer("the outputs", source, target)
    pending = [records, outputs]
    # Until the gather is known to have ended: outputs may still be on other nodes.
    left = "; outputs of jobs on other nodes may not be on the head yet"
    try:
        left = _gathered(cluster, remote_tmp.path, sweep_dir)
        cluster.run(f"mkdir -p {shlex.quote(records.source)}")
        records.run(cluster)
        pending.remove(records)
        home = _outputs_home(sync, sweep_dir)
        if home is not None:  # the records say where the jobs wrote on the head: now here
            move_records_home(sweep_dir, jobs, str(sweep_dir), home)
        if _head_has(cluster, f"{remote_tmp.path}/{RETURNS}"):
            cluster.rsync_down(f"{remote_tmp.path}/{RETURNS}", str(returns))
        log.info(f"Bringing home the outputs: the head's {source} to {target}")
        if sync.include or sync.exclude:
            # Filter on the head, so that only what is wanted crosses the network.
            outputs = _Transfer("the outputs", f"{remote_tmp.path}/down", target)
            pending = [outputs]
            filter_cmd = rsync_command(
                f"{source}/",
                f"{outputs.source}/",
                include=list(sync.include),
                exclude=list(sync.exclude),
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
        f"(include={list(sync.include)}, exclude={list(sync.exclude)})"
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
        gather_cmd = gather_command(remote_tmp.path, sweep_dir)
        config = str(cluster.config_file.resolve())
        commands.insert(0, shlex.join(["ray", "exec", config, gather_cmd]))
    cluster.keep_for(Leftovers(what=what, commands=commands, interrupted=interrupted))


def _gathered(cluster: Cluster, remote_tmp: str, sweep_dir: Path) -> str:
    """Make sure every node's outputs are on the head: the driver's gather report
    says so, or the driver did not finish (or not its gather) and `gather` runs
    (it stops the driver if it still runs). Returns what is still on other
    nodes ("; ..."), or "" when everything is on the head."""
    report = _gather_report(cluster, remote_tmp)
    if report is None or not report.get("complete"):
        log.warning("Gathering the outputs of the jobs that finished on the cluster's nodes")
        try:
            cluster.run(gather_command(remote_tmp, sweep_dir))
        except ClusterCommandError as exc:
            log.error(f"Could not gather the outputs on the cluster's nodes: {exc}")
        report = _gather_report(cluster, remote_tmp)
    if report is None:
        return "; the outputs on the cluster's other nodes could not be gathered onto the head"
    if not report.get("complete"):
        nodes = ", ".join(
            f"{entry.get('node')} ({', '.join(map(str, entry.get('paths', [])))})"
            for entry in report.get("left", [])
        )
        return f"; outputs are still on other nodes of the cluster: {nodes or 'unknown'}"
    return ""


def _gather_report(cluster: Cluster, remote_tmp: str) -> dict[str, Any] | None:
    path = shlex.quote(f"{remote_tmp}/{GATHER_REPORT}")
    out = cluster.run(
        f'if [ -f {path} ]; then echo "{_REPORT_MARK}$(cat {path})"; fi', with_output=True
    )
    for line in out.splitlines():
        if line.startswith(_REPORT_MARK):
            try:
                report = json.loads(line[len(_REPORT_MARK) :])
            except json.JSONDecodeError:
                return None
            return report if isinstance(report, dict) else None
    return None


def _head_has(cluster: Cluster, path: str) -> bool:
    out = cluster.run(f"if [ -f {shlex.quote(path)} ]; then echo {_FOUND}; fi", with_output=True)
    return _FOUND in out.split()


def _head_sweep_dir(remote_tmp: str, sweep_dir: Path) -> str:
    return str(sweep_dir) if sweep_dir.is_absolute() else f"{remote_tmp}/{sweep_dir}"
