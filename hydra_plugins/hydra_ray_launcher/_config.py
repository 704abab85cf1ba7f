"""Structured configs of the launchers, registered in Hydra's ConfigStore when
Hydra scans its plugins, and the resolvers their defaults use.

Hydra imports this module at every start of every app (plugin discovery), so it
imports nothing heavy: no ray, no boto3; the resolvers read installed versions
from package metadata.
"""

import functools
import importlib.metadata
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import omegaconf
from hydra.core.config_store import ConfigStore
from omegaconf import OmegaConf

# The plugin's version. It lives here, not in __init__, because __init__ imports
# this module before anything else and the cluster's pip packages pin it.
__version__ = "2.0.0.dev0"


@dataclass
class RayInitConf:
    """Arguments of `ray.init()`. Null means Ray's own default; add any other
    argument of `ray.init()` with `+hydra.launcher.ray.init.NAME=VALUE`."""

    # null: Ray's own resolution (RAY_ADDRESS, else a new local Ray);
    # "HOST:PORT" or "auto": connect to a running cluster.
    address: str | None = None
    # Resources of the local Ray this launcher starts (ignored, with a warning,
    # when connecting to an existing cluster: that cluster's own resources apply).
    num_cpus: int | None = None
    num_gpus: int | None = None
    # Reservable memory of the local node in bytes (Ray's `_memory`).
    memory: int | None = None
    object_store_memory: int | None = None
    # Mappings (name -> amount, key -> value). Typed Any, as every dict-valued key
    # here: OmegaConf 2.3 cannot set an Optional[Dict] that is null from the command
    # line (`...resources={custom: 1}` crashes inside it).
    resources: Any = None
    labels: Any = None
    include_dashboard: bool | None = None
    dashboard_host: str | None = None
    dashboard_port: int | None = None
    namespace: str | None = None
    # Ray's runtime_env: {working_dir: ., env_vars: {K: v}, pip: [...], ...}.
    runtime_env: Any = None
    log_to_driver: bool | None = None
    logging_level: str | None = None


@dataclass
class RayRemoteConf:
    """Options of `ray.remote()` for every job's task. Null means Ray's own
    default; add any other option with `+hydra.launcher.ray.remote.NAME=VALUE`."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    # Memory a job reserves, in bytes; Ray schedules no more jobs on a node
    # than its memory allows.
    memory: int | None = None
    # Custom resources a job reserves: {name: amount}.
    resources: Any = None
    accelerator_type: str | None = None
    # Times Ray runs a job again when its worker process or node dies.
    max_retries: int | None = None
    # Also run a job again when it raises (true, or a list of exception names).
    retry_exceptions: Any = None
    # A runtime_env for the jobs' tasks, on top of ray.init's.
    runtime_env: Any = None
    # "DEFAULT" or "SPREAD" (spread jobs over the nodes of a cluster).
    scheduling_strategy: str | None = None
    # Node labels a job's node must have: {key: value}.
    label_selector: Any = None


@dataclass
class RayConf:
    init: RayInitConf = field(default_factory=RayInitConf)
    remote: RayRemoteConf = field(default_factory=RayRemoteConf)


@dataclass
class SweepRunConf:
    """The keys every launcher of this plugin has: how a sweep runs."""

    # On a terminal: a live display of the sweep (counts, time left, latest job
    # events; on a cluster, drawn by the head's driver). false, or not a
    # terminal: one log line per job event.
    progress: bool = True
    # Seconds a job (each attempt) may run; then it is cancelled and reported as
    # timed out, and the other jobs go on. null: no limit.
    job_timeout_s: float | None = None
    # At most this many jobs run at once (a shared cluster, a licence limit); the
    # others wait in the driver, in job order, and count as queued. null: as many
    # as the cluster's resources allow.
    max_concurrent_jobs: int | None = None
    # A job past job_timeout_s is first stopped catchably (KeyboardInterrupt raised
    # in the job: its chance to save a checkpoint), then, this many seconds later,
    # cancelled by force.
    stop_grace_s: float = 10.0
    # true: a job that timed out runs again (in its own job dir), within `retries`.
    retry_timed_out: bool = False
    # How many more times a job whose task function raises runs again (in the same
    # job dir). A job whose process or node dies is retried by Ray: ray.remote.max_retries.
    retries: int = 0
    # true, with hydra.sweep.dir=<an earlier sweep's dir>: the jobs that succeeded
    # there are not run again (their recorded results are returned); the others run.
    resume: bool = False
    # true: start nothing (no Ray, no cluster, no upload); run every check a real
    # run makes before it spends, print the plan and every problem, and exit
    # (0 when the plan holds).
    dry_run: bool = False


@dataclass
class RayLauncherConf(SweepRunConf):
    _target_: str = "hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher"
    ray: RayConf = field(default_factory=RayConf)


# ---- The cluster launchers (`ray_aws`, `ray_cluster`) ----


@dataclass
class EnvSetupConf:
    """How the cluster's nodes get the Python environment the jobs need. At launch
    both become the first entries of `ray.cluster.setup_commands`: `commands`,
    then one `pip install` per package, then the user's own setup_commands."""

    # pip package -> version installed on every node (`pip install NAME==VERSION`;
    # null: the newest). Pinned to this machine's versions, so that the pickled
    # job spec loads on the cluster. `ray` installs `ray[default]` (the cluster
    # needs its dashboard and runtime-env agent); `_` in a name means `-`.
    pip_packages: dict[str, str | None] = field(
        default_factory=lambda: {
            "omegaconf": "${ray_pkg_version:omegaconf}",
            "hydra_core": "${ray_pkg_version:hydra}",
            "ray": "${ray_pkg_version:ray}",
            "cloudpickle": "${ray_pkg_version:cloudpickle}",
            "hydra_ray_launcher": __version__,
        }
    )
    # Shell commands run on every node before the pip installs. The default makes a
    # conda env with this machine's Python and puts it first on PATH (Ray runs every
    # remote command in a login shell that sources ~/.bashrc).
    commands: list[str] = field(
        default_factory=lambda: [
            "conda create -n hydra_${python_version:micro} python=${python_version:micro} -y",
            "echo 'export PATH=\"$HOME/anaconda3/envs/hydra_${python_version:micro}/bin:$PATH\"' "
            ">> ~/.bashrc",
        ]
    )


@dataclass
class ClusterConf:
    """Ray's cluster config (the YAML of `ray up`), key for key: every key means
    what Ray's cluster launcher docs say. Null means Ray's default for the
    provider (the key is not passed to Ray). Add any other key of Ray's schema
    with `+hydra.launcher.ray.cluster.KEY=VALUE` (e.g. rsync_exclude). As
    `ray_cluster` has it, no defaults of its own: a null key takes its value
    from `hydra.launcher.cluster_yaml` if given, else Ray's default for the
    provider (e.g. Ray's plain `ray start` commands); the dict keys are merged
    key by key on top of cluster_yaml's."""

    # Names the cluster's nodes: a second launch with the same name reuses them.
    # null: a name unique to the multirun, hydra-<app name>-<8 hex> (set one to
    # reuse a cluster, e.g. with stop_cluster=false).
    cluster_name: str | None = None
    # Legacy global minimum of workers; Ray now reads min_workers per node type
    # (except for provider local, where it is the number of worker_ips to use).
    min_workers: int | None = None
    # How fast the autoscaler adds nodes: up to this times the current number at once.
    upscaling_speed: float | None = None
    # Most worker nodes at once, all node types together.
    max_workers: int | None = None
    # Idle workers are removed after this many minutes.
    idle_timeout_minutes: float | None = None
    # Run Ray and the jobs in this image's container; image '' means no docker.
    docker: Any = None
    # The cloud or machines the nodes come from: `type` (aws, gcp, azure, local,
    # ...) and that provider's keys (local: head_ip, worker_ips). Required by
    # `ray_cluster`: at least `type`, e.g. provider local with head_ip and worker_ips.
    provider: Any = None
    # How Ray logs in to the nodes: ssh_user, ssh_private_key, ssh_proxy_command.
    auth: Any = None
    # Node types by name: node_config (the provider's instance settings), resources,
    # min_workers and max_workers of that type.
    available_node_types: Any = None
    # The entry of available_node_types the head is made of.
    head_node_type: str | None = None
    # Remote path -> local path, copied to every node before the setup commands.
    file_mounts: dict[str, Any] = field(default_factory=dict)
    # Run on every node before anything else (outside the docker container).
    initialization_commands: list[str] | None = None
    # Paths on the head copied to every worker.
    cluster_synced_files: list[str] | None = None
    # Run on every node; env_setup's commands come first.
    setup_commands: list[str] | None = None
    head_setup_commands: list[str] | None = None
    worker_setup_commands: list[str] | None = None
    head_start_ray_commands: list[str] | None = None
    worker_start_ray_commands: list[str] | None = None
    # Legacy keys of older Ray versions, accepted so that old configs still load;
    # current Ray's schema rejects them, so they are dropped with a warning.
    initial_workers: int | None = None
    autoscaling_mode: str | None = None
    target_utilization_fraction: float | None = None


# `ray_cluster`'s: the keys with no defaults of their own.
GenericClusterConf = ClusterConf


@dataclass
class AWSClusterConf(ClusterConf):
    """The cluster config with the defaults of `ray_aws`: an AWS provider,
    m5.large nodes, spot workers, Ray's usual start commands."""

    min_workers: int | None = 0
    upscaling_speed: float | None = 1.0
    max_workers: int | None = 1
    idle_timeout_minutes: float | None = 5
    docker: dict[str, Any] = field(
        default_factory=lambda: {
            "image": "",
            "container_name": "",
            "pull_before_run": True,
            "run_options": [],
        }
    )
    provider: dict[str, Any] = field(
        default_factory=lambda: {
            "type": "aws",
            "region": "us-west-2",
            "availability_zone": "us-west-2a,us-west-2b",
            # true: teardown stops the nodes (kept for reuse, disks still billed);
            # false: it terminates them.
            "cache_stopped_nodes": False,
            "key_pair": {"key_name": "hydra-${oc.env:USER,user}"},
        }
    )
    auth: dict[str, Any] = field(default_factory=lambda: {"ssh_user": "ubuntu"})
    available_node_types: dict[str, Any] = field(
        default_factory=lambda: {
            "ray.head.default": {
                "resources": {},
                "node_config": {"InstanceType": "m5.large", "ImageId": "ami-0a2363a9cff180a64"},
            },
            "ray.worker.default": {
                "min_workers": 0,
                "max_workers": 2,
                "resources": {},
                "node_config": {
                    "InstanceType": "m5.large",
                    "ImageId": "ami-0a2363a9cff180a64",
                    "InstanceMarketOptions": {"MarketType": "spot"},
                },
            },
        }
    )
    head_node_type: str | None = "ray.head.default"
    initialization_commands: list[str] | None = field(default_factory=list)
    cluster_synced_files: list[str] | None = field(default_factory=list)
    setup_commands: list[str] | None = field(default_factory=list)
    head_setup_commands: list[str] | None = field(default_factory=list)
    worker_setup_commands: list[str] | None = field(default_factory=list)
    head_start_ray_commands: list[str] | None = field(
        default_factory=lambda: [
            "ray stop",
            "ulimit -n 65536;ray start --head --port=6379 --object-manager-port=8076 "
            "--autoscaling-config=~/ray_bootstrap_config.yaml",
        ]
    )
    worker_start_ray_commands: list[str] | None = field(
        default_factory=lambda: [
            "ray stop",
            "ulimit -n 65536; ray start --address=$RAY_HEAD_IP:6379 --object-manager-port=8076",
        ]
    )


@dataclass
class RayClusterRayConf(RayConf):
    """The `ray` node of the cluster launchers. `init` and `remote` apply to the
    jobs' Ray on the cluster, as with the `ray` launcher."""

    cluster: ClusterConf = field(default_factory=AWSClusterConf)
    # Where the launcher's commands on the head run: auto (in the docker
    # container if docker is used, else on the host), host, or docker.
    run_env: str = "auto"


@dataclass
class RsyncConf:
    """An rsync between this machine and the cluster's head. include/exclude are
    rsync's patterns, includes tried before excludes, the first match wins: with
    include ['model', '*.py'] and exclude ['*'] only `model/` (all of it) and the
    top-level .py files are copied. An include naming a directory without
    wildcards brings everything below it."""

    # sync_up: the local dir to upload, relative to the working dir or absolute;
    # null: nothing is uploaded. sync_down: the dir on the head to bring back;
    # null: the sweep output dir on the cluster.
    source_dir: str | None = None
    # sync_up: the dir on the head; null: a temp dir of the launch, on the jobs'
    # PYTHONPATH and removed after them. sync_down: the local dir; null: the
    # local sweep output dir.
    target_dir: str | None = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)


@dataclass
class ClusterSyncDownConf(RsyncConf):
    """sync_down of the cluster launchers: an rsync from the head (see
    RsyncConf), and where the results also go as each batch ends."""

    # A URI this machine and the cluster's nodes reach (as ray_jobs' sync_down.storage):
    # s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///SHARED/VOLUME. The driver
    # puts the batch's results there as one pack; they then need not wait on a
    # cluster whose launcher is gone (it tears itself down), and a resume fetches
    # them there. Removed there once home. null: they wait on the head.
    storage: str | None = None


@dataclass
class RayLoggingConf:
    """Output of Ray's cluster launcher (`ray.autoscaler.sdk.configure_logging`)."""

    # auto (pretty on a terminal, else record), pretty, or record.
    log_style: str = "auto"
    # auto, true or false: colours in Ray's output.
    color_mode: str = "auto"
    # 0 to 3: how much of each cluster step Ray prints.
    verbosity: int = 0


@dataclass
class RayCreateOrUpdateClusterConf:
    """Options of `ray.autoscaler.sdk.create_or_update_cluster`."""

    # Update the nodes' files and setup without restarting Ray on them.
    no_restart: bool = False
    # Skip the setup commands and only restart Ray (not together with no_restart).
    restart_only: bool = False
    # Ignore the cached cluster config: ask the provider again for everything.
    no_config_cache: bool = False


@dataclass
class RayTeardownClusterConf:
    """Options of `ray.autoscaler.sdk.teardown_cluster` (when stop_cluster is true)."""

    # Remove the workers only; the head keeps running (and costing).
    workers_only: bool = False
    # Keep min_workers workers running.
    keep_min_workers: bool = False


@dataclass
class RayAWSLauncherConf(SweepRunConf):
    """The `ray_aws` launcher: creates (or updates) a cluster on AWS with Ray's
    cluster launcher, runs the sweep there, and tears the cluster down."""

    _target_: str = "hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher"
    env_setup: EnvSetupConf = field(default_factory=EnvSetupConf)
    ray: RayClusterRayConf = field(default_factory=RayClusterRayConf)
    # true: tear the cluster down after the jobs; false: keep it running for the
    # next launch (it keeps costing until `ray down`).
    stop_cluster: bool = True
    # Before the jobs: upload the app's code to the head.
    sync_up: RsyncConf = field(default_factory=RsyncConf)
    # After the jobs: bring their outputs home (by default the whole sweep dir).
    sync_down: ClusterSyncDownConf = field(default_factory=ClusterSyncDownConf)
    logging: RayLoggingConf = field(default_factory=RayLoggingConf)
    create_update_cluster: RayCreateOrUpdateClusterConf = field(
        default_factory=RayCreateOrUpdateClusterConf
    )
    teardown_cluster: RayTeardownClusterConf = field(default_factory=RayTeardownClusterConf)
    # Seconds a lost connection to the head is made again while its driver runs
    # (the driver goes on without it); then the launcher stops with the resume command.
    reconnect_s: float = 120.0
    # Minutes the cluster may sit idle (no sweep driver, no transfer) before it
    # tears itself down, as teardown_cluster says: when this process is gone
    # (a closed laptop, kill -9) or kept the cluster for outputs not home.
    # null: never (the cluster then costs until `ray down`).
    autodown_minutes: float | None = 60.0


@dataclass
class RayClusterLauncherConf(RayAWSLauncherConf):
    """The `ray_cluster` launcher: the same launcher for any provider of Ray's
    cluster launcher (local machines, gcp, azure, aws, ...), without AWS defaults."""

    ray: RayClusterRayConf = field(default_factory=lambda: RayClusterRayConf(cluster=ClusterConf()))
    # A Ray cluster YAML file (as for `ray up`), relative to the working dir or
    # absolute: the base of the cluster config. Keys set in ray.cluster win over
    # the file's; dicts (provider, auth, ...) are merged key by key.
    cluster_yaml: str | None = None


@functools.cache
def _distributions_by_module() -> dict[str, list[str]]:
    # Reads every installed distribution's metadata: once per process.
    return dict(importlib.metadata.packages_distributions())


# ---- The Jobs API launcher (`ray_jobs`) ----


@dataclass
class JobsSyncUpConf:
    """What of the app's code travels with the Ray job (in its working_dir,
    uploaded by Ray's own client through the dashboard). include/exclude as for
    `ray_aws`'s sync_up (rsync's patterns; see RsyncConf)."""

    # The local dir to send, relative to the working dir or absolute; null: none.
    # It is on the jobs' sys.path on every node.
    source_dir: str | None = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=lambda: [".git", "__pycache__"])


@dataclass
class JobsSyncDownConf:
    """What of the sweep dir written on the cluster comes home (the jobs'
    records always do). include/exclude as for `ray_aws`'s sync_down."""

    # The local dir; null: the local sweep output dir.
    target_dir: str | None = None
    include: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    # Where the cluster puts the pack for this machine to fetch, instead of the
    # dashboard: a URI both sides reach, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or
    # file:///SHARED/VOLUME (pyarrow.fs on both; its query options pass through, e.g.
    # ?endpoint_override=HOST:PORT&scheme=http&region=...). Removed there once home.
    # null: through the dashboard.
    storage: str | None = None


@dataclass
class RayJobsLauncherConf(SweepRunConf):
    """The `ray_jobs` launcher: the whole sweep as one Ray job (per batch) on a
    running cluster, through its dashboard's Jobs API alone (KubeRay, Anyscale,
    a port-forward): no SSH, no GCS port."""

    _target_: str = "hydra_plugins.hydra_ray_launcher.ray_jobs_launcher.RayJobsLauncher"
    # The dashboard: http(s)://HOST:PORT (8265 by default). null: RAY_API_SERVER_ADDRESS,
    # else RAY_ADDRESS when it is an http(s) address, as `ray job submit` reads them.
    address: str | None = None
    # HTTP headers for every request to the dashboard: {Authorization: "Bearer ..."}.
    headers: Any = None
    # TLS: true (verify with the system's CAs), false, or a CA bundle's path.
    verify: Any = True
    # This machine's Ray token goes only to a dashboard that asks for one; over plain
    # http to another machine (not loopback), only with this set.
    token_over_http: bool = False
    # ray.init (its runtime_env too) and ray.remote, as the `ray` launcher's: used by
    # the sweep's driver on the cluster.
    ray: RayConf = field(default_factory=RayConf)
    # The Ray job's runtime_env (env_vars, pip, ...), merged with what the launcher
    # ships (its working_dir: the code, the job spec, this plugin).
    runtime_env: Any = None
    sync_up: JobsSyncUpConf = field(default_factory=JobsSyncUpConf)
    sync_down: JobsSyncDownConf = field(default_factory=JobsSyncDownConf)
    # Resources the sweep's driver reserves on the cluster (Ray's own default: none).
    entrypoint_num_cpus: float | None = None
    entrypoint_num_gpus: float | None = None
    entrypoint_memory: int | None = None
    entrypoint_resources: Any = None
    # The Python on the head that runs the sweep's driver. null: the one that runs the
    # cluster's Ray (found from the raylet, whatever the head's PATH says), else
    # `python` on PATH.
    entrypoint_python: str | None = None
    # After Ctrl-C, seconds the stopped driver has to cancel the jobs and pack what
    # finished before Ray kills it (RAY_JOB_STOP_WAIT_TIME_S).
    stop_wait_s: int = 60
    # Seconds to wait for the cluster's job agent when the dashboard answers "No
    # available agent to submit job" (a head just up), before the launcher gives up.
    agent_wait_s: float = 20
    # Seconds a lost connection to the dashboard (a port-forward restarted, a network
    # blip) is made again while the Ray job runs; then the launcher stops with the
    # resume command.
    reconnect_s: float = 120.0


def ray_pkg_version(name: str) -> str:
    """`${ray_pkg_version:NAME}`: the installed version of the package that
    provides the module NAME (hydra -> hydra-core), or of the distribution NAME."""
    dists = sorted(set(_distributions_by_module().get(name, []))) or [name]
    if len(dists) > 1:
        raise ValueError(
            f"ray_pkg_version: the module {name!r} comes from several packages ({dists}); "
            "write the version in hydra.launcher.env_setup.pip_packages instead"
        )
    try:
        return importlib.metadata.version(dists[0])
    except importlib.metadata.PackageNotFoundError:
        raise ValueError(
            f"ray_pkg_version: no installed package provides {name!r}. Install it here, or "
            "set its version in hydra.launcher.env_setup.pip_packages (null: the newest)"
        ) from None


def python_version(level: str = "minor") -> str:
    """`${python_version:LEVEL}`: this Python's version; LEVEL major ("3"),
    minor ("3.11", the default) or micro ("3.11.7")."""
    parts = {"major": 1, "minor": 2, "micro": 3}
    count = parts.get(level or "minor")
    if count is None:
        raise ValueError(f"python_version: level {level!r} is not one of major, minor, micro")
    return ".".join(str(n) for n in sys.version_info[:count])


def _resolver_registration() -> Any:
    """OmegaConf 2.4 (with Hydra 1.4) renamed register_new_resolver to
    register_resolver and warns on the old name; in 2.3, register_resolver is an
    older, deprecated API with other semantics."""
    version = tuple(int(p) for p in re.findall(r"\d+", omegaconf.__version__)[:2])
    return OmegaConf.register_resolver if version >= (2, 4) else OmegaConf.register_new_resolver


def register_configs() -> None:
    """Register the resolvers and store the launchers' configs in Hydra's
    ConfigStore (group hydra/launcher)."""
    register = _resolver_registration()
    register("ray_pkg_version", ray_pkg_version, replace=True)
    register("python_version", python_version, replace=True)
    store = ConfigStore.instance()
    for name, node in (
        ("ray", RayLauncherConf),
        ("ray_aws", RayAWSLauncherConf),
        ("ray_cluster", RayClusterLauncherConf),
        ("ray_jobs", RayJobsLauncherConf),
    ):
        store.store(group="hydra/launcher", name=name, node=node, provider="ray_launcher")
