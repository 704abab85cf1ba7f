"""The dry run (`hydra.launcher.dry_run=true`): the checks a launch makes before
it spends anything, all of them (a problem does not hide the next one), and the
plan printed: the jobs with their composed configs, the resources a job takes,
the settings that shape the run, and for the cluster launchers the cluster
config as Ray would get it, what would be uploaded and, on AWS, whether these
credentials may launch each node type (EC2's own DryRun).

Nothing is started: no Ray, no cluster, no upload, no file changed. The launch
ends after the plan: exit 0 when it holds, else a ConfigError listing every
problem, each naming its key and the fix.

Ray and boto3 are imported inside functions, where it is needed.
"""

import os
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import (
    InterpolationResolutionError,
    MissingMandatoryValue,
    UnsupportedInterpolationType,
)

from hydra_ray.checks.dashboard import dashboard_problems
from hydra_ray.checks.resources import JobResources, for_sweep, plain_dict, request, without_nulls
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.jobs import Job
from hydra_ray.core.redact import redacted, redacting_logger
from hydra_ray.core.settings import (
    ClusterSettings,
    DetachedSettings,
    JobsSettings,
    Settings,
    SyncDown,
    SyncUp,
)
from hydra_ray.driver.protocol import sweep_dir_as_given
from hydra_ray.engine.report import describe, described
from hydra_ray.infra.dashboard import UPLOAD_LIMIT, dashboard_address
from hydra_ray.infra.storage import storage_problems
from hydra_ray.infra.sync import rsync_command

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import SweepBook, SweepSettings

log = redacting_logger(__name__)

T = TypeVar("T")

# Jobs listed one by one; a longer sweep shows its first and last ones.
_JOBS_SHOWN = 20
_GIB = 2**30


class Plan:
    """What a dry run found: sections of the plan and the problems, in order."""

    def __init__(self, launcher: str) -> None:
        self.launcher = launcher
        self.sections: list[tuple[str, list[str]]] = []
        self.problems: list[str] = []
        self.notes: list[str] = []

    def add(self, title: str, lines: Iterable[str]) -> None:
        self.sections.append((title, list(lines)))

    def check(self, fn: Callable[[], T]) -> T | None:
        """fn(), or None with its ConfigError listed as a problem."""
        try:
            return fn()
        except ConfigError as exc:
            self.problems.append(str(exc))
            return None

    def finish(self) -> NoReturn:
        """Print the plan; exit 0 if it holds (SystemExit), else raise a ConfigError
        of all problems."""
        text = [
            f"Dry run of the {self.launcher} launcher: nothing was started (no Ray, no "
            "cluster, no upload) and no record written."
        ]
        # Every line as it is printed, through the one redaction (a setup command's
        # URL with a password, the dashboard's address with a token, ...).
        for title, lines in self.sections:
            text.append(f"{title}:")
            text += [f"  {redacted(line)}" for line in lines]
        if self.notes:
            text.append("Notes:")
            text += [f"  {redacted(note)}" for note in self.notes]
        log.info("\n".join(text))
        if self.problems:
            listed = "".join(f"\n  {n}. {redacted(p)}" for n, p in enumerate(self.problems, 1))
            count = f"{len(self.problems)} problem" + ("s" if len(self.problems) > 1 else "")
            raise ConfigError(f"Dry run: {count} would stop this sweep:{listed}")
        log.info("Dry run: the plan holds. Run again without hydra.launcher.dry_run to start it.")
        raise SystemExit(0)


def plan_jobs(plan: Plan, loader: Any, config: DictConfig, jobs: Sequence[Job]) -> None:
    """Compose (and resolve) every job's config as its job would; lists the jobs."""
    lines: list[str] = []
    for pos, job in enumerate(jobs):
        try:
            cfg = loader.load_sweep_config(config, list(job.overrides))
        except Exception as exc:  # Hydra's own composition errors have no common base
            plan.problems.append(
                f"job #{job.idx} ({describe(job.overrides)}) cannot be composed: {exc}"
            )
            continue
        with open_dict(cfg):  # as the job gets them
            cfg.hydra.job.id = str(job.idx)
            cfg.hydra.job.num = job.idx
        try:
            problem = _unresolvable(cfg)
        except UnsupportedInterpolationType as exc:
            # The task may register that resolver itself: worth a look, not a problem.
            plan.notes.append(f"job #{job.idx}: {exc} (not registered before the launch)")
            problem = None
        if problem is not None:
            plan.problems.append(f"job #{job.idx} ({describe(job.overrides)}): {problem}")
        if pos < _JOBS_SHOWN // 2 or pos >= len(jobs) - _JOBS_SHOWN // 2:
            try:
                where = str(Path(str(cfg.hydra.sweep.dir)) / str(cfg.hydra.sweep.subdir))
            except InterpolationResolutionError as exc:
                where = "?"
                plan.problems.append(f"job #{job.idx}: its output dir does not resolve: {exc}")
            lines.append(f"#{job.idx} : {describe(job.overrides) or '(no overrides)'} -> {where}")
        elif pos == _JOBS_SHOWN // 2:
            lines.append(f"... {len(jobs) - _JOBS_SHOWN} more ...")
    plan.add(f"{len(jobs)} jobs (each config composed and resolved)", lines)


def _unresolvable(cfg: DictConfig) -> str | None:
    """Why the job's own config (not `hydra`) would not resolve when the task
    reads it; None if it resolves. An unknown resolver raises."""
    from hydra.core.hydra_config import HydraConfig

    hydra_config = HydraConfig.instance()
    before = hydra_config.cfg
    hydra_config.set_config(cfg)  # for ${hydra:...}
    try:
        task = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
        OmegaConf.to_container(task, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        return f"{exc.full_key} is ??? (a value to give): set it with an override"
    except UnsupportedInterpolationType:
        raise
    except InterpolationResolutionError as exc:
        return f"{exc.full_key} does not resolve: {exc}"
    finally:
        hydra_config.cfg = before
    return None


def plan_settings(plan: Plan, checked: "SweepSettings", sweep_dir: Path) -> None:
    """The keys that shape the run, already checked."""
    policy = checked.policy
    timeout = f"{policy.job_timeout_s:g} s" if policy.job_timeout_s else "none"
    cap = policy.max_concurrent_jobs
    plan.add(
        "Settings",
        [
            f"sweep dir: {sweep_dir.absolute()}",
            f"job_timeout_s: {timeout}; retries (a job that raises): {policy.retries}",
            f"stop_grace_s: {policy.stop_grace_s:g} s; retry_timed_out: {policy.retry_timed_out}",
            f"max_concurrent_jobs: {cap if cap is not None else 'as many as the resources allow'}",
            f"progress: {'live display' if checked.live else 'one line per job event'}",
            f"resume: {checked.resume}",
        ],
    )


def plan_resume(plan: Plan, book: "SweepBook", jobs: Sequence[Job]) -> None:
    """Which jobs a resume would take from the records, read only."""
    found = plan.check(lambda: book.plan(jobs, dry=True))
    if found is None:
        return
    reused, to_run = found
    if book.settings.resume:
        nums = ", ".join(f"#{o.idx}" for o in reused) or "none"
        plan.add("Resume", [f"succeeded earlier, not run again: {nums}", f"to run: {len(to_run)}"])


# Each distinct set of a batch's ray.remote options, with the jobs that ask for
# it (None: every job).
OptionSets = list[tuple[dict[str, Any], list[int] | None]]


def plan_resources(plan: Plan, resources: JobResources, jobs: Sequence[Job]) -> OptionSets:
    """The `ray.remote` options the jobs' tasks get, each distinct set checked by
    ray.remote() itself; where they differ per job, grouped by the jobs that ask
    for each set, and a job whose values do not resolve is a problem."""
    if resources.shared is not None:
        shown = ", ".join(f"{k}={v}" for k, v in redacted(resources.shared).items())
        plan.add("Each job (ray.remote)", [shown or "Ray's defaults (num_cpus=1)"])
        return [(resources.shared, None)]
    plan.problems += resources.resolve(jobs)
    groups = resources.distinct(jobs)
    lines = []
    for options, idxs in groups:
        assert idxs is not None  # per job: each set names its jobs
        shown = ", ".join(f"{k}={v}" for k, v in redacted(options).items())
        which = "job #" if len(idxs) == 1 else "jobs #"
        lines.append(
            f"{which}{', #'.join(map(str, idxs))}: {described(request(options))} ({shown})"
        )
    plan.add(f"Resources per job ({', '.join(resources.interpolated)} differ per job)", lines)
    return groups


def plan_local_capacity(
    plan: Plan, init: Mapping[str, Any], remote: Mapping[str, Any], jobs: list[int] | None
) -> None:
    """For a new local Ray: can this machine run `jobs` (None: every job) at all?"""
    options = without_nulls(init)
    need = without_nulls(remote)
    which = "" if jobs is None else f" (job #{', #'.join(map(str, jobs))})"
    cpus = options.get("num_cpus", os.cpu_count() or 1)
    memory = options.get("memory", _physical_memory())
    job_cpus = need.get("num_cpus", 1)
    if job_cpus > cpus:
        plan.problems.append(
            f"hydra.launcher.ray.remote.num_cpus={job_cpus}{which}: the local Ray has {cpus} "
            "CPUs, so no job could ever start. Lower it, or raise hydra.launcher.ray.init.num_cpus"
        )
    if need.get("memory", 0) > memory:
        plan.problems.append(
            f"hydra.launcher.ray.remote.memory={need['memory']}{which}: more than the "
            f"{memory} bytes of the local Ray. Lower it, or set hydra.launcher.ray.init.memory"
        )
    if need.get("num_gpus"):
        gpus = options.get("num_gpus")
        if gpus is None:
            note = "GPUs: Ray counts this machine's at start; the dry run does not"
            if note not in plan.notes:
                plan.notes.append(note)
        elif need["num_gpus"] > gpus:
            plan.problems.append(
                f"hydra.launcher.ray.remote.num_gpus={need['num_gpus']}{which}: the local Ray "
                f"has {gpus} GPUs (hydra.launcher.ray.init.num_gpus). Lower one or raise the other"
            )
    have = options.get("resources") or {}
    for name, amount in (need.get("resources") or {}).items():
        if have.get(name, 0) < amount:
            plan.problems.append(
                f"hydra.launcher.ray.remote.resources.{name}={amount}{which}: the local Ray has "
                f"{have.get(name, 0)} of it. Give it with hydra.launcher.ray.init.resources"
            )


def _physical_memory() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


# ---- The cluster launchers ----


def plan_cluster(plan: Plan, prepared: Mapping[str, Any]) -> None:
    """The cluster config as Ray's cluster launcher would get it (its own
    defaults filled in), its node types and the order of its commands."""
    provider = prepared.get("provider") or {}
    lines = [f"name: {prepared.get('cluster_name')}; provider: {provider.get('type')}"]
    if provider.get("type") == "local":
        lines.append(f"head: {provider.get('head_ip')}; workers: {provider.get('worker_ips')}")
    for name, node in (prepared.get("available_node_types") or {}).items():
        node_config = node.get("node_config") or {}
        kind = node_config.get("InstanceType") or node_config.get("machineType") or ""
        head = " (head)" if name == prepared.get("head_node_type") else ""
        counts = f"min {node.get('min_workers', 0)}, max {node.get('max_workers', 0)} workers"
        what = " ".join(w for w in (kind, node_config.get("ImageId", ""), counts) if w)
        lines.append(f"node type {name}{head}: {what}")
    lines.append(f"max_workers (all types): {prepared.get('max_workers')}")
    plan.add("Cluster", lines)
    # prepare_config has put setup_commands first in head_ and worker_setup_commands.
    for node, keys in (
        ("the head", ("initialization_commands", "head_setup_commands", "head_start_ray_commands")),
        (
            "each worker",
            ("initialization_commands", "worker_setup_commands", "worker_start_ray_commands"),
        ),
    ):
        commands = [str(c) for key in keys for c in prepared.get(key) or []]
        plan.add(f"Commands on {node}, in the order they run", commands or ["none"])
    shown = OmegaConf.to_yaml(OmegaConf.create(redacted(prepared)))
    plan.add("The cluster config Ray would get", shown.rstrip("\n").splitlines())


def plan_sync(plan: Plan, settings: DetachedSettings) -> None:
    """What sync_up would upload (the real run's rsync filter, run as a dry
    run) and what sync_down would bring back."""
    up = settings.sync_up
    lines: list[str] = []
    if up.source_dir is None:
        lines.append("sync_up: nothing (hydra.launcher.sync_up.source_dir is null)")
    else:
        source = Path(up.source_dir).expanduser().resolve()
        if source.is_dir():
            target = up.target_dir or "a temp dir of the launch on the head"
            upload_lines(lines, "sync_up", source, up, f" to {target}")
    down = settings.sync_down
    lines.append(
        f"sync_down: {down.source_dir or 'the sweep dir on the cluster'} -> "
        f"{down.target_dir or 'the local sweep dir'}{filters_text(down)}"
    )
    if down.storage:
        lines.append(
            f"sync_down.storage: each batch's results also go to {redacted(down.storage)} "
            "(a resume fetches them there when the cluster is gone)"
        )
    plan.add("Transfers", lines)


def upload_lines(lines: list[str], what: str, source: Path, up: SyncUp, to: str = "") -> int:
    """Add the files sync_up's filter lets through (a count, the largest) to
    `lines`; return their total size in bytes."""
    files = _would_copy(source, up.include, up.exclude)
    total = sum(size for _, size in files)
    lines.append(f"{what}: {len(files)} files, {size_text(total)} from {source}{to}")
    lines += [f"  {size_text(size):>10}  {name}" for name, size in _largest(files)]
    return total


def filters_text(down: SyncDown) -> str:
    """sync_down's include/exclude, if any, as the plan shows them."""
    if not (down.include or down.exclude):
        return ""
    return f" (include={down.include}, exclude={down.exclude})"


def _would_copy(source: Path, include: list[str], exclude: list[str]) -> list[tuple[str, int]]:
    """(path, bytes) of every file the real run's rsync filter lets through."""
    with tempfile.TemporaryDirectory(prefix="hydra-ray-dry-") as tmp:
        argv = rsync_command(f"{source}/", f"{tmp}/x/", include=include, exclude=exclude)
        res = subprocess.run(
            [*argv[:1], "--dry-run", "--out-format=%l %n", *argv[1:]],
            capture_output=True,
            text=True,
            check=False,
        )
    files = []
    for line in res.stdout.splitlines():
        size, _, name = line.partition(" ")
        if size.isdigit() and name and not name.endswith("/"):
            files.append((name, int(size)))
    return files


def size_text(n: int) -> str:
    value = float(n)
    for unit in ("bytes", "KiB", "MiB"):
        if value < 1024:
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"


def _largest(files: list[tuple[str, int]], count: int = 5) -> list[tuple[str, int]]:
    return sorted(files, key=lambda f: -f[1])[:count]


def plan_aws(plan: Plan, cluster: Mapping[str, Any]) -> None:
    """Who these credentials are, and whether they may launch each node type:
    EC2's DryRun on RunInstances (nothing is created), plus the instance type
    offered in the region and the image found."""
    provider = cluster.get("provider") or {}
    if provider.get("type") != "aws":
        return
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        return  # check_provider_access has listed it
    session = boto3.session.Session()
    if session.get_credentials() is None:
        return  # listed by check_provider_access
    region = provider.get("region")
    lines: list[str] = []
    try:
        identity = session.client("sts", region_name=region).get_caller_identity()
        lines.append(f"credentials: {identity.get('Arn')} (account {identity.get('Account')})")
    except (BotoCoreError, ClientError) as exc:
        plan.problems.append(
            f"AWS refused these credentials: {exc}. Check `aws sts get-caller-identity`"
        )
        plan.add("AWS", lines)
        return
    ec2 = session.client("ec2", region_name=region)
    key = "hydra.launcher.ray.cluster.available_node_types"
    for name, node in (cluster.get("available_node_types") or {}).items():
        node_config = node.get("node_config") or {}
        kind, image = node_config.get("InstanceType"), node_config.get("ImageId")
        if not kind or not image:
            lines.append(f"{name}: no InstanceType and ImageId to check")
            continue
        problem = _ec2_refusal(ec2, kind, image, region, ClientError)
        if problem is None:
            lines.append(f"{name}: may launch {kind} from {image} in {region} (EC2 DryRun)")
        else:
            lines.append(f"{name}: refused")
            plan.problems.append(f"{key}.{name}.node_config: {problem}")
    plan.add("AWS", lines)


def _ec2_refusal(ec2: Any, kind: str, image: str, region: Any, client_error: Any) -> str | None:
    offered = ec2.describe_instance_type_offerings(
        LocationType="region", Filters=[{"Name": "instance-type", "Values": [kind]}]
    )["InstanceTypeOfferings"]
    if not offered:
        return f"InstanceType {kind} is not offered in {region}: pick one that is"
    try:
        if not ec2.describe_images(ImageIds=[image])["Images"]:
            return f"ImageId {image} is not found in {region}: give an image of that region"
    except client_error as exc:
        return f"ImageId {image}: {exc.response['Error'].get('Message', exc)} (in {region})"
    try:
        ec2.run_instances(DryRun=True, ImageId=image, InstanceType=kind, MinCount=1, MaxCount=1)
    except client_error as exc:
        return ec2_dry_run_refusal(exc.response["Error"], kind, image)
    return None  # a DryRun that did not raise: EC2 should have said DryRunOperation


def ec2_dry_run_refusal(error: Mapping[str, Any], kind: str, image: str) -> str | None:
    """EC2's answer to a DryRun RunInstances, as a problem (None: allowed)."""
    code = str(error.get("Code", ""))
    message = error.get("Message", "")
    if code == "DryRunOperation":
        return None
    if code == "UnauthorizedOperation":
        return (
            f"these credentials may not launch {kind} from {image} (ec2:RunInstances "
            f"denied): {message}. Grant ec2:RunInstances or use other credentials"
        )
    if code.startswith("InvalidAMIID"):
        return f"ImageId {image}: {message}"
    return f"EC2 would refuse {kind} from {image}: {code}: {message}"


# ---- The dry runs of the launchers ----


def plan_sweep(
    plan: Plan,
    hydra_context: Any,
    config: DictConfig,
    settings: Settings,
    job_overrides: Sequence[Sequence[str]],
    first: int,
) -> OptionSets:
    """What every launcher plans: the jobs, the settings, a resume, `ray.remote`;
    returns the distinct sets of ray.remote options."""
    from hydra_ray.launch.sweep import SweepBook, sweep_settings, task_overrides

    jobs = [Job(first + pos, list(ov)) for pos, ov in enumerate(job_overrides)]
    sweep_dir = Path(str(config.hydra.sweep.dir))
    plan_jobs(plan, hydra_context.config_loader, config, jobs)
    checked = plan.check(lambda: sweep_settings(settings))
    if checked is not None:
        plan_settings(plan, checked, sweep_dir)
        plan_resume(plan, SweepBook(sweep_dir, task_overrides(config), checked), jobs)
    resources = plan.check(lambda: for_sweep(hydra_context, config))
    if resources is None:  # options ray.remote() refuses: still checked against the Ray
        remote = without_nulls(plain_dict(settings.ray_remote))
        option_sets: OptionSets = [(remote, None)]
    else:
        option_sets = plan_resources(plan, resources, jobs)
    if first > 0:
        plan.notes.append(
            f"the sweeper gave a batch from job #{first}: a dry run plans the batch it is "
            "given (a sweeper that picks later jobs from earlier results cannot show those)"
        )
    return option_sets


def dry_run_local(
    hydra_context: Any,
    config: DictConfig,
    settings: Settings,
    job_overrides: Sequence[Sequence[str]],
    first: int,
) -> NoReturn:
    """The dry run of the `ray` launcher."""
    from hydra_ray.checks.validate import ray_init_kwargs
    from hydra_ray.infra.connect import check_connection

    plan = Plan("ray")
    option_sets = plan_sweep(plan, hydra_context, config, settings, job_overrides, first)
    init = settings.ray_init
    kwargs = ray_init_kwargs(init)
    address = kwargs.get("address") or os.environ.get("RAY_ADDRESS")
    if address in (None, "local"):
        options = without_nulls(init)
        cpus = options.get("num_cpus", os.cpu_count() or 1)
        memory = options.get("memory", _physical_memory())
        for remote, jobs in option_sets:
            plan_local_capacity(plan, init, remote, jobs)
        plan.add(
            "Where the jobs run",
            [f"this machine's Ray: {cpus} CPUs, {memory / _GIB:.1f} GiB memory"],
        )
    else:
        # A probe of the address (and its token), as the run makes before ray.init().
        plan.check(lambda: check_connection(kwargs))
        plan.add(
            "Where the jobs run",
            [f"the Ray cluster at {address} (its resources are seen when the run connects)"],
        )
    plan.finish()


def dry_run_cluster(
    hydra_context: Any,
    config: DictConfig,
    settings: ClusterSettings,
    job_overrides: Sequence[Sequence[str]],
    first: int,
    launcher: str,
) -> NoReturn:
    """The dry run of the cluster launchers (`ray_aws`, `ray_cluster`)."""
    from hydra_ray.checks.validate import (
        check_provider_access,
        cluster_config_for_ray,
        cluster_launch_problems,
        named_cluster,
        remote_path_problems,
        validate_cluster_config,
    )

    plan = Plan(launcher)
    plan_sweep(plan, hydra_context, config, settings, job_overrides, first)
    plan.problems += [str(p) for p in cluster_launch_problems(settings)]
    head_sweep = sweep_dir_as_given(str(config.hydra.sweep.dir))
    plan.problems += [str(p) for p in remote_path_problems(settings, head_sweep)]
    plan.problems += [str(p) for p in storage_problems(settings.sync_down.storage)]
    cluster = plan.check(
        lambda: named_cluster(
            cluster_config_for_ray(settings), settings, str(config.hydra.job.name)
        )
    )
    if cluster is not None:
        prepared = plan.check(lambda: validate_cluster_config(cluster))
        plan.check(lambda: check_provider_access(cluster))
        plan_cluster(plan, cluster if prepared is None else prepared)
        plan_aws(plan, cluster)
    plan_sync(plan, settings)
    plan.finish()


def dry_run_jobs(
    hydra_context: Any,
    config: DictConfig,
    settings: JobsSettings,
    job_overrides: Sequence[Sequence[str]],
    first: int,
) -> NoReturn:
    """The dry run of the `ray_jobs` launcher: no request reaches the dashboard."""
    plan = Plan("ray_jobs")
    plan_sweep(plan, hydra_context, config, settings, job_overrides, first)
    plan.problems += [str(p) for p in dashboard_problems(settings)]
    try:
        address = dashboard_address(settings)
    except ConfigError:
        address = "(none: see the problems)"
    lines = [f"one Ray job per batch, submitted to the dashboard at {address}"]
    up = settings.sync_up
    source = Path(up.source_dir).expanduser().resolve() if up.source_dir else None
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
