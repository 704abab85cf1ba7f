"""The life of a cluster made by Ray's cluster launcher (`ray.autoscaler.sdk`):
`ClusterLifetime` holds the multirun's one cluster, `cluster_session` creates it
and on exit tears it down (or keeps it, when outputs are still on it), and
`remote_temp_dir` makes the launch's private dir on the head and removes it.

Ray is imported inside functions, where it is needed.
"""

import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from hydra_ray.core.errors import ClusterCommandError
from hydra_ray.core.redact import redacting_logger
from hydra_ray.core.settings import ClusterSettings
from hydra_ray.infra.autodown import TMP_ROOT, Autodown

log = redacting_logger(__name__)

# Signals that end the run as Ctrl-C does, minus its "tear down anyway": kill,
# systemd, a closed terminal or a dropped ssh session.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
# After a Ctrl-C that interrupted the transfers home: how long a second Ctrl-C
# still tears the cluster down.
SECOND_CTRL_C_S = 10.0
_TMP_MARK = "HYDRA_RAY_TMP="


@dataclass(frozen=True)
class Leftovers:
    """Outputs that are not home: the cluster, and the head's temp dir, are kept
    for them. `commands` finish the job; `interrupted`: by Ctrl-C, so that a
    second one tears down anyway."""

    what: str
    commands: list[str]
    interrupted: bool


@dataclass
class Cluster:
    """A running cluster, as its config (and the file it was written to) identify
    it to Ray's SDK."""

    config: dict[str, Any]
    run_env: str
    config_file: Path
    # Set when outputs did not all come home: the session keeps the cluster then.
    leftovers: Leftovers | None = field(default=None)
    # Its watchdog on the head, when armed (hydra.launcher.autodown_minutes).
    autodown: Autodown | None = field(default=None)

    @property
    def name(self) -> str:
        return str(self.config["cluster_name"])

    def keep_for(self, leftovers: Leftovers) -> None:
        self.leftovers = leftovers

    def run(self, cmd: str, *, with_output: bool = False, run_env: str | None = None) -> str:
        """Run a shell command on the head; its output streams to this terminal,
        or is returned with `with_output`. Raises ClusterCommandError if it fails."""
        from ray.autoscaler import sdk

        with _named_errors(f"`{cmd}` on the cluster's head"):
            out = sdk.run_on_cluster(
                self.config, cmd=cmd, run_env=run_env or self.run_env, with_output=with_output
            )
        if isinstance(out, bytes):
            return out.decode(errors="replace")
        return out or ""

    def rsync_up(self, source: str, target: str) -> None:
        self._rsync(source, target, down=False)

    def rsync_down(self, source: str, target: str) -> None:
        self._rsync(source, target, down=True)

    def _rsync(self, source: str, target: str, *, down: bool) -> None:
        from ray.autoscaler import sdk

        remote = source if down else target
        with _named_errors(f"rsync {source} -> {target} ({'from' if down else 'to'} the head)"):
            sdk.rsync(self.config, source=source, target=target, down=down)
        if self._uses_docker():
            # Ray's docker runner copies through the head *host*'s /tmp, readable by all,
            # and leaves the copy there: the job spec holds the app's config and state.
            staged = f"{sdk.get_docker_host_mount_location(self.name)}/{remote.strip('/')}"
            self.run(f"rm -rf {shlex.quote(staged)}", run_env="host")

    def _uses_docker(self) -> bool:
        docker = self.config.get("docker")
        return isinstance(docker, dict) and bool(docker.get("container_name"))

    def down_command(self) -> str:
        return f"ray down -y {shlex.quote(str(self.config_file.resolve()))}"


@contextmanager
def _named_errors(what: str) -> Iterator[None]:
    """Ray's SDK raises click's errors, its own, or a subprocess's for a failed
    command (RuntimeError once the head is gone): one named error instead."""
    import click
    from ray.autoscaler._private.subprocess_output_util import ProcessRunnerError

    try:
        yield
    except click.ClickException as exc:
        raise ClusterCommandError(f"{what} failed: {exc.format_message()}") from exc
    except (ProcessRunnerError, subprocess.CalledProcessError, RuntimeError) as exc:
        raise ClusterCommandError(f"{what} failed: {exc}") from exc


@dataclass
class RemoteTmp:
    """The launch's private temp dir on the head; `keep()` leaves it in place."""

    path: str
    kept: bool = False

    def keep(self) -> None:
        self.kept = True


@contextmanager
def remote_temp_dir(cluster: Cluster, existing: str | None = None) -> Iterator[RemoteTmp]:
    """A temp dir on the head, private to the user (mktemp makes it mode 700), or
    the `existing` one an earlier launch made (a resume re-attaches to it);
    removed on exit unless kept (it then holds outputs that are not home).
    Raises ClusterCommandError if the head gives no dir."""
    if existing is None:
        out = cluster.run(
            f'd=$(mktemp -d {TMP_ROOT}/hydra-ray-XXXXXXXX) && echo "{_TMP_MARK}$d"',
            with_output=True,
        )
        paths = [line[len(_TMP_MARK) :].strip() for line in out.splitlines() if _TMP_MARK in line]
        if not paths:
            raise ClusterCommandError(f"could not make a temp dir on the cluster's head: {out!r}")
        existing = paths[0]
    tmp = RemoteTmp(existing)
    log.info(f"Remote temp dir on the head: {tmp.path}")
    try:
        yield tmp
    finally:
        if tmp.kept:
            log.warning(f"Kept the head's temp dir {tmp.path}: it holds outputs not yet home")
        else:
            try:
                cluster.run(f"rm -rf {shlex.quote(tmp.path)}")
            except ClusterCommandError as exc:  # never mask the error that ends the run
                log.warning(f"Could not remove the remote temp dir {tmp.path}: {exc}")


class ClusterLifetime:
    """The multirun's one cluster: created at the first `get()`, reused by the
    next batches, and torn down (or kept, as configured or for outputs not yet
    home) by `close()`: at the end of the multirun, at once on an error in a
    launch, and at the interpreter's exit only as a last resort."""

    def __init__(self, settings: ClusterSettings, cluster_config: dict[str, Any]) -> None:
        self._settings = settings
        self._cluster_config = cluster_config
        self._cluster: Cluster | None = None
        self._stack = ExitStack()

    def head_runs(self) -> bool:
        """Whether the cluster's head is up (before `get()`: a resume re-attaches
        to what an earlier run left on it, and creates nothing for that)."""
        from ray.autoscaler import sdk

        try:
            sdk.get_head_node_ip(self._cluster_config)
        except RuntimeError:  # Ray: "Head node of cluster (NAME) not found!"
            return False
        return True

    def get(self, config_file: Path, *, restart: bool = True) -> Cluster:
        """The cluster, created or updated at the first call; `restart=False`
        keeps Ray running on it (an earlier run's driver may still run there)."""
        if self._cluster is None:
            # The last resort, for a sweeper that raises after a batch (Hydra then
            # skips on_multirun_end): threading's exit hooks run in reverse order,
            # so this one runs before concurrent.futures' own (registered at its
            # import), which refuses thread-pool work, as Ray's docker teardown needs.
            import concurrent.futures.thread  # noqa: F401

            threading._register_atexit(self.close)  # type: ignore[attr-defined]
            self._cluster = self._stack.enter_context(
                cluster_session(self._settings, self._cluster_config, config_file, restart=restart)
            )
        return self._cluster

    def close(self) -> None:
        self._cluster = None
        self._stack.close()


def _raise_system_exit(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


@contextmanager
def _stop_signals(handler: Any) -> Iterator[None]:
    previous = {sig: signal.signal(sig, handler) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def cluster_session(
    settings: ClusterSettings,
    cluster_config: dict[str, Any],
    config_file: Path,
    *,
    restart: bool = True,
) -> Iterator[Cluster]:
    """Create or update the cluster, yield it, and on exit tear it down
    (`stop_cluster=true`) or say how to (`stop_cluster=false`, or outputs not
    yet home), whatever happened in between: an error, a failed job, Ctrl-C,
    SIGTERM or SIGHUP."""
    from ray.autoscaler import sdk

    sdk.configure_logging(
        log_style=settings.log_style,
        color_mode=str(settings.color_mode).lower(),
        verbosity=settings.verbosity,
    )
    cluster = Cluster(config=cluster_config, run_env=settings.run_env, config_file=config_file)
    # SIGTERM/SIGHUP would end the process without running this exit: make them
    # exceptions, which every `finally` on the way sees (the outputs still come home).
    with _stop_signals(_raise_system_exit):
        config_file.parent.mkdir(parents=True, exist_ok=True)
        # The cluster's config as Ray gets it (provider credentials, setup commands
        # with tokens): for this user only, as the commands it prints need it whole.
        fd = os.open(config_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)  # one an earlier run left with a wider mode
        with os.fdopen(fd, "w") as f:
            f.write(yaml.safe_dump(cluster_config, sort_keys=False))
        try:
            # Not restarting Ray wins over the user's restart_only (Ray takes one of them).
            no_restart = bool(settings.no_restart) or not restart
            restart_only = bool(settings.restart_only) and restart
            log.info(
                f"Creating or updating cluster {cluster.name!r} (no_restart={no_restart}, "
                f"restart_only={restart_only}, no_config_cache={settings.no_config_cache})"
            )
            # The written file, not the dict: Ray's own hints ("ray down ...") then name
            # a file that exists.
            sdk.create_or_update_cluster(
                str(config_file),
                no_restart=no_restart,
                restart_only=restart_only,
                no_config_cache=settings.no_config_cache,
            )
            _arm_autodown(settings, cluster)
            yield cluster
        finally:
            _stop_or_keep(settings, cluster)


def _arm_autodown(settings: ClusterSettings, cluster: Cluster) -> None:
    """Start the head's watchdog (see `hydra_ray.infra.autodown`), or say that
    nothing stops the cluster if this process goes."""
    if settings.autodown_minutes is None:
        log.warning(
            f"hydra.launcher.autodown_minutes=null: if this process is gone before it tears "
            f"cluster {cluster.name!r} down (a closed laptop, a lost network, kill -9), the "
            f"cluster keeps running and costing until `{cluster.down_command()}`"
        )
        return
    autodown = Autodown(
        cluster.name,
        float(settings.autodown_minutes),
        workers_only=bool(settings.workers_only),
        keep_min_workers=bool(settings.keep_min_workers),
    )
    try:
        cluster.run(autodown.start_command())
    except ClusterCommandError as exc:
        log.warning(
            f"Could not start the watchdog that tears cluster {cluster.name!r} down when this "
            f"process is gone ({exc}): if it goes, tear the cluster down with "
            f"`{cluster.down_command()}`"
        )
        return
    cluster.autodown = autodown
    log.info(
        f"Cluster {cluster.name!r} tears itself down when it has run no sweep driver and no "
        f"transfer for {autodown.minutes:g} min (hydra.launcher.autodown_minutes): if this "
        f"process is gone; its watchdog logs to the head's {autodown.log_path()}"
    )


def _disarm_autodown(cluster: Cluster) -> None:
    if cluster.autodown is None:
        return
    try:
        cluster.run(cluster.autodown.stop_command())
    except ClusterCommandError as exc:  # the teardown, or the warning, comes next anyway
        log.warning(f"Could not stop the cluster's watchdog on the head: {exc}")


def autodown_deadline(cluster: Cluster) -> str:
    """When the cluster tears itself down if nothing runs on it from now: a
    clock time, or "" when it does not (hydra.launcher.autodown_minutes=null)."""
    if cluster.autodown is None:
        return ""
    return time.strftime("%H:%M", time.localtime(time.time() + cluster.autodown.limit_s))


def _stop_or_keep(settings: ClusterSettings, cluster: Cluster) -> None:
    if cluster.leftovers is not None:
        _keep_for_leftovers(settings, cluster, cluster.leftovers)
    elif not settings.stop_cluster:
        _disarm_autodown(cluster)
        log.warning(
            f"Cluster {cluster.name!r} keeps running (stop_cluster=false) and costs money until "
            f"it is torn down, also when idle (its autodown watchdog is stopped): "
            f"{cluster.down_command()}"
        )
    else:
        _teardown(settings, cluster)


def _keep_for_leftovers(settings: ClusterSettings, cluster: Cluster, leftovers: Leftovers) -> None:
    steps = "\n".join(f"    {cmd}" for cmd in [*leftovers.commands, cluster.down_command()])
    message = (
        f"NOT ALL OUTPUTS ARE HOME: {leftovers.what}. Cluster {cluster.name!r} is kept "
        f"running (and costing) with them. To bring them home and then tear it down, "
        f"run (from this directory, where this run could reach the cluster):\n{steps}"
    )
    if cluster.autodown is not None:
        try:  # the clock starts now, so that the deadline said is the one met
            cluster.run(cluster.autodown.seen_command())
        except ClusterCommandError as exc:
            log.warning(f"Could not restart the watchdog's clock on the head: {exc}")
        disarm = shlex.join(
            ["ray", "exec", str(cluster.config_file.resolve()), cluster.autodown.stop_command()]
        )
        message += (
            f"\nIf nothing is transferred from it before then, the cluster tears itself down "
            f"at {autodown_deadline(cluster)} (hydra.launcher.autodown_minutes="
            f"{cluster.autodown.minutes:g}), with what is on it. To keep it longer:\n    {disarm}"
        )
    if not (leftovers.interrupted and settings.stop_cluster):
        log.error(message)
        return
    log.error(
        f"{message}\nCtrl-C again within {SECOND_CTRL_C_S:.0f} s tears the cluster down "
        "anyway: what did not come home is then lost with it."
    )
    try:
        time.sleep(SECOND_CTRL_C_S)
    except KeyboardInterrupt:
        log.warning("Second Ctrl-C: tearing the cluster down anyway")
        _teardown(settings, cluster)
    else:
        log.error(
            f"Cluster {cluster.name!r} keeps running: tear it down with {cluster.down_command()}"
        )
    # As a shell reports an interrupted command, whichever way Python would end.
    raise SystemExit(128 + signal.SIGINT)


def _teardown(settings: ClusterSettings, cluster: Cluster) -> None:
    from ray.autoscaler import sdk

    cached = bool(cluster.config.get("provider", {}).get("cache_stopped_nodes", False))
    log.info(
        f"Stopping cluster {cluster.name!r} now (stop_cluster=true, "
        f"workers_only={settings.workers_only}, keep_min_workers={settings.keep_min_workers})"
    )
    stop: list[int] = []
    # A SIGTERM or SIGHUP now would leave a half torn-down cluster: the teardown
    # ends first, then the signal ends the run.
    with _stop_signals(lambda signum, frame: stop.append(signum)):
        _disarm_autodown(cluster)
        try:
            sdk.teardown_cluster(
                str(cluster.config_file),
                workers_only=settings.workers_only,
                keep_min_workers=settings.keep_min_workers,
            )
        except BaseException:
            log.error(
                f"Tearing down cluster {cluster.name!r} failed: run `{cluster.down_command()}` "
                "to stop paying for it"
            )
            raise
    what = "Stopped the nodes of" if cached else "Deleted"
    log.info(f"{what} the cluster (provider.cache_stopped_nodes={str(cached).lower()})")
    if stop:
        raise SystemExit(128 + stop[0])
