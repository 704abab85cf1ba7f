"""Launch of the cluster launchers (`ray_aws`, `ray_cluster`): check everything,
get a cluster, ship the job spec and the code, run the engine on the head,
bring the job returns and every job's outputs home."""

import logging
import shlex
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import cloudpickle
from hydra.core.utils import JobReturn, configure_log, setup_globals
from omegaconf import DictConfig

from ._engine import Job
from ._head_driver import PLUGIN_DIR, JobSpec, load_outcomes
from ._jobs import JobOutcome, capture_sweep_state
from ._records import RECORD_DIR
from ._sweep import SweepBook, run_batch, sweep_settings
from ._sync import rsync_command
from ._validate import (
    check_launch_preconditions,
    cluster_config_for_ray,
    plain_dict,
    validate_cluster_config,
)

if TYPE_CHECKING:
    from ._cluster import Cluster
    from .ray_aws_launcher import RayAWSLauncher

log = logging.getLogger(__name__)

_TMP_MARK = "HYDRA_RAY_TMP="


class RemoteDriverError(RuntimeError):
    """The driver on the cluster's head ended without returning the jobs' results."""


def launch(
    launcher: "RayAWSLauncher", job_overrides: Sequence[Sequence[str]], initial_job_idx: int
) -> Sequence[JobReturn]:
    assert launcher.config is not None
    assert launcher.hydra_context is not None
    assert launcher.task_function is not None
    config = launcher.config
    settings: DictConfig = config.hydra.launcher
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if launcher.cluster_config is None:
        # Everything that can be refused is refused here, before anything costs.
        sweep = sweep_settings(settings)
        check_launch_preconditions(settings)
        cluster_config = cluster_config_for_ray(settings)
        validate_cluster_config(cluster_config)
        launcher.cluster_config = cluster_config
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        launcher.book = SweepBook(sweep_dir, list(config.hydra.overrides.task), sweep)
    book = launcher.book
    assert book is not None

    def run(jobs: list[Job], already_done: int) -> list[JobOutcome]:
        assert launcher.hydra_context is not None and launcher.task_function is not None
        # The job spec is pickled before any cluster exists: an app that cannot be
        # pickled fails here, for free.
        spec = JobSpec(
            state=capture_sweep_state(launcher.hydra_context, launcher.task_function, config),
            jobs=jobs,
            configs={
                job.idx: launcher.hydra_context.config_loader.load_sweep_config(
                    config, job.overrides
                )
                for job in jobs
            },
            init=plain_dict(settings.ray.init),
            remote=plain_dict(settings.ray.remote),
            sweep_dir=str(book.sweep_dir),
            code_dir=_code_dir(settings.sync_up),
            policy=book.settings.policy,
            live=book.settings.live,
            width=shutil.get_terminal_size().columns if book.settings.live else None,
            already_done=already_done,
        )
        return _run_on_cluster(launcher, spec, settings, book.sweep_dir)

    return run_batch(book, job_overrides, initial_job_idx, run)


def _run_on_cluster(
    launcher: "RayAWSLauncher", spec: JobSpec, settings: DictConfig, sweep_dir: Path
) -> list[JobOutcome]:
    with tempfile.TemporaryDirectory(prefix="hydra-ray-") as tmp:
        local_tmp = Path(tmp)
        spec_file = local_tmp / "job_spec.pkl"
        spec_file.write_bytes(cloudpickle.dumps(spec))
        log.info(f"Pickle for jobs: {spec_file}")
        cluster = launcher.cluster(sweep_dir / ".hydra" / "ray_cluster.yaml")
        remote_tmp = _make_remote_tmp(cluster)
        try:
            _ship_plugin(cluster, remote_tmp, local_tmp)
            _sync_up(cluster, settings.sync_up, remote_tmp, local_tmp)
            cluster.rsync_up(str(spec_file), f"{remote_tmp}/job_spec.pkl")
            finished = False
            try:
                _run_head_driver(cluster, remote_tmp, spec.code_dir)
                finished = True
            finally:
                # Whatever finished is brought home, also when the driver failed.
                if not finished:
                    _gather_after_failure(cluster, remote_tmp, sweep_dir)
                _sync_down(cluster, settings.sync_down, remote_tmp, sweep_dir)
                _sync_records(cluster, remote_tmp, sweep_dir)
            cluster.rsync_down(f"{remote_tmp}/returns.pkl", str(local_tmp / "returns.pkl"))
            return load_outcomes(str(local_tmp / "returns.pkl"))
        finally:
            _remove_remote_tmp(cluster, remote_tmp)


def _code_dir(sync: DictConfig) -> str | None:
    """Where the synced code lives on the head: target_dir, or `code` in the remote
    temp dir (relative paths are relative to it: the head driver runs there)."""
    if sync.source_dir is None:
        return None
    return str(sync.target_dir) if sync.target_dir is not None else "code"


def _make_remote_tmp(cluster: "Cluster") -> str:
    """A temp dir on the head, private to the user (mktemp makes it mode 700)."""
    out = cluster.run(
        f'd=$(mktemp -d /tmp/hydra-ray-XXXXXXXX) && echo "{_TMP_MARK}$d"', with_output=True
    )
    for line in out.splitlines():
        if line.startswith(_TMP_MARK):
            path = line[len(_TMP_MARK) :].strip()
            log.info(f"Remote temp dir on the head: {path}")
            return path
    raise RemoteDriverError(f"could not make a temp dir on the cluster's head: {out!r}")


def _remove_remote_tmp(cluster: "Cluster", remote_tmp: str) -> None:
    try:
        cluster.run(f"rm -rf {shlex.quote(remote_tmp)}")
    except Exception as exc:  # the cluster may be gone already; never mask the real error
        log.warning(f"Could not remove the remote temp dir {remote_tmp}: {exc}")


def _ship_plugin(cluster: "Cluster", remote_tmp: str, local_tmp: Path) -> None:
    """Send this plugin's own source: the head driver and the jobs on every node
    run the very code of the launching machine, whatever version is installed there.
    rich (pure Python), which draws the head driver's display, goes with it: the
    cluster's packages need not include it."""
    import rich

    staged = local_tmp / "plugin"
    for source, target in (
        (Path(__file__).parent, staged / "hydra_plugins" / "hydra_ray_launcher"),
        (Path(rich.__file__).parent, staged / "rich"),
    ):
        target.mkdir(parents=True)
        subprocess.run(
            rsync_command(f"{source}/", f"{target}/", include=[], exclude=["__pycache__"]),
            check=True,
        )
    cluster.rsync_up(f"{staged}/", f"{remote_tmp}/{PLUGIN_DIR}/")


def _sync_up(cluster: "Cluster", sync: DictConfig, remote_tmp: str, local_tmp: Path) -> None:
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


def _head_driver_command(remote_tmp: str, args: str, code_dir: str | None = None) -> str:
    """The shell command that runs `_head_driver ARGS` in the head's temp dir,
    with the shipped plugin (and the synced code) on its path."""
    tmp = shlex.quote(remote_tmp)
    pythonpath = f"{tmp}/{PLUGIN_DIR}:" + (f"{shlex.quote(code_dir)}:" if code_dir else "")
    return (
        f"cd {tmp} && PYTHONPATH={pythonpath}$PYTHONPATH RAY_DEDUP_LOGS=0 "
        f"python -m hydra_plugins.hydra_ray_launcher._head_driver {args}"
    )


def _run_head_driver(cluster: "Cluster", remote_tmp: str, code_dir: str | None) -> None:
    tmp = shlex.quote(remote_tmp)
    cmd = _head_driver_command(remote_tmp, f"{tmp}/job_spec.pkl {tmp}/returns.pkl", code_dir)
    log.info("Running the jobs from the cluster's head")
    try:
        cluster.run(cmd)
    except (Exception, SystemExit) as exc:
        raise RemoteDriverError(
            f"The driver on the cluster's head failed ({exc}); its output is above. "
            "Outputs of the jobs that finished were synced down."
        ) from exc


def _gather_after_failure(cluster: "Cluster", remote_tmp: str, sweep_dir: Path) -> None:
    """The driver did not finish: stop it if it still runs, and gather onto the
    head what the finished jobs wrote on other nodes (and remove it there)."""
    cmd = _head_driver_command(remote_tmp, f"gather {shlex.quote(str(sweep_dir))}")
    log.warning("Gathering the outputs of the jobs that finished on the cluster's nodes")
    try:
        cluster.run(cmd)
    except (Exception, SystemExit) as exc:
        log.error(f"Could not gather the outputs on the cluster's nodes: {exc}")


def _head_sweep_dir(remote_tmp: str, sweep_dir: Path) -> str:
    return str(sweep_dir) if sweep_dir.is_absolute() else f"{remote_tmp}/{sweep_dir}"


def _sync_records(cluster: "Cluster", remote_tmp: str, sweep_dir: Path) -> None:
    """Bring the jobs' records home whatever sync_down filters: resume decides
    here, from them."""
    source = f"{_head_sweep_dir(remote_tmp, sweep_dir)}/{RECORD_DIR}"
    try:
        cluster.run(f"mkdir -p {shlex.quote(source)}")
        cluster.rsync_down(f"{source}/", f"{sweep_dir / RECORD_DIR}/")
    except (Exception, SystemExit) as exc:
        log.error(f"Could not bring the jobs' records home from {source}: {exc}")


def _sync_down(cluster: "Cluster", sync: DictConfig, remote_tmp: str, sweep_dir: Path) -> None:
    """rsync the outputs (by default the sweep dir on the head, which holds every
    node's outputs) to the local sweep dir, filtered by include/exclude."""
    if sync.source_dir is not None:
        source = str(sync.source_dir)
    else:
        source = _head_sweep_dir(remote_tmp, sweep_dir)
    target = Path(str(sync.target_dir)) if sync.target_dir is not None else sweep_dir
    target.mkdir(parents=True, exist_ok=True)
    if sync.include or sync.exclude:
        # Filter on the head, so that only what is wanted crosses the network.
        staged = f"{remote_tmp}/down"
        filter_cmd = rsync_command(
            f"{source}/", f"{staged}/", include=list(sync.include), exclude=list(sync.exclude)
        )
        try:
            cluster.run(f"mkdir -p {shlex.quote(staged)} && {shlex.join(filter_cmd)}")
        except (Exception, SystemExit) as exc:
            log.error(f"Could not sync down {source}: {exc}")
            return
        source = staged
    try:
        cluster.rsync_down(f"{source}/", f"{target}/")
    except (Exception, SystemExit) as exc:
        log.error(f"Could not sync down {source}: {exc}")
        return
    log.info(
        f"Synced down the head's {source} to {target} "
        f"(include={list(sync.include)}, exclude={list(sync.exclude)})"
    )
