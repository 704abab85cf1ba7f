"""The same Hydra sweep under Hydra's `basic` launcher, the joblib launcher and
our `ray` launcher (cold: it starts its own Ray; warm: a `ray start --head`
already runs on this machine and is found with nothing set), side by side in
one invocation, with ratios against `basic`.

Run by hand, on an otherwise idle machine:

    .venv/bin/python benchmarks/bench_launchers.py                  # every scenario, 1 run each
    .venv/bin/python benchmarks/bench_launchers.py --runs 3 --scenario sleep20
    .venv/bin/python benchmarks/bench_launchers.py --scenario trivial10000   # about an hour
    .venv/bin/python benchmarks/bench_launchers.py --scenario trivial1000 --scenario trivial10000 \
        --launcher ray                    # the jobs phase's ratio, 10,000 jobs to 1,000
    .venv/bin/python benchmarks/bench_launchers.py --scenario trivial1000 \
        --launcher ray --launcher "ray per-job"   # the cost of per-job resources
    .venv/bin/python benchmarks/bench_launchers.py --scenario trivial1000 \
        --launcher ray --ray-at a34181e   # `ray` here against `ray` as of a commit

For each launcher and sweep it prints the medians of: the whole process's wall
time; the time from the process's start to the launcher's `launch()` (Hydra's
own start and its sweeper's validation, which composes every job's config:
not the launcher's); from `launch()` to the first job's start; the jobs phase
(first job's start to last job's end); the launching process's peak RSS; and
the CPU time a worker process spends per job (between two of its jobs: the
launcher's own work around the job included; `basic` runs the jobs in the
launching process).
Also measured in the same invocation: Ray's own fixed cost (a process that
starts and shuts down a local Ray with the same `ray.init` options and runs no
job) and the size of the job spec a cluster launcher ships at 10,000 jobs
(built here, without a cluster), against the spec that carried every job's
composed config.
`hydra-joblib-launcher` is installed into this interpreter if it is missing.
"""

import argparse
import contextlib
import importlib.util
import itertools
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

APP = Path(__file__).with_name("app.py")

SCENARIOS = {
    "trivial1": ("1 trivial job", ["i=0"]),
    "sleep20": ("20 jobs that each sleep 1 s", ["seconds=1", "i=range(0,20)"]),
    "trivial1000": ("1,000 trivial jobs", ["i=range(0,1000)"]),
    "trivial10000": ("10,000 trivial jobs", ["i=range(0,10000)"]),
}
DEFAULT_SCENARIOS = ("trivial1", "sleep20", "trivial1000")
LAUNCHERS = {
    "basic": ["hydra/launcher=basic"],
    "joblib": ["hydra/launcher=joblib"],
    "ray": ["hydra/launcher=ray"],
    "ray warm": ["hydra/launcher=ray"],
    # ray.remote interpolating into each job's config: resolved per job (a compose
    # per job in the launching process, handed to the job), against `ray`.
    "ray per-job": ["hydra/launcher=ray", "hydra.launcher.ray.remote.num_cpus=${oc.select:cpus,1}"],
}


@dataclass
class Run:
    wall: float
    # From the process's start to the launcher's launch() (Hydra's start and
    # its sweeper's validation: not the launcher's), and from there to the first job.
    to_launch: float
    to_first_job: float
    jobs_phase: float
    peak_rss: int
    # CPU seconds a worker process spends per job (median between its jobs); None:
    # no worker ran two jobs.
    job_cpu: float | None
    # Our launcher's own "N jobs done in X s" (from the batch's first submission
    # to its last job's end, Ray's start of the workers included); None: other
    # launchers.
    said_done: float | None = None


# The launchers' first line in launch() (basic: "Launching 20 jobs locally";
# joblib: "Joblib.Parallel(...) is launching 20 jobs"; ours: "Ray Launcher is
# launching 20 jobs, ..."), stamped by Hydra's log format.
_LAUNCHING = re.compile(r"^\[([0-9-]+ [0-9:]+,[0-9]{3})\]\[HYDRA\] .*[Ll]aunching \d+ jobs", re.M)


_DONE_IN = re.compile(r"\] \d+ jobs? done in ([0-9.]+) s")


def _launched_at(output: str) -> float:
    found = _LAUNCHING.search(output)
    if found is None:
        sys.exit(f"no launch() line in the app's output:\n{output[-2000:]}")
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()


def run_once(cmd: list[str], cwd: Path, env: dict[str, str]) -> Run:
    times = Path(env["BENCH_TIMES"])
    times.unlink(missing_ok=True)
    started = time.time()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, env=env)
    wall = time.time() - started
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    rows = [line.split() for line in times.read_text().splitlines()]
    jobs = [(float(r[1]), float(r[2])) for r in rows if r[0] == "job"]
    cpu_by_pid: dict[str, list[float]] = {}
    for r in rows:
        if r[0] == "job":
            cpu_by_pid.setdefault(r[3], []).append(float(r[4]))
    deltas = [b - a for cpu in cpu_by_pid.values() for a, b in itertools.pairwise(sorted(cpu))]
    rss = [int(r[1]) for r in rows if r[0] == "rss"]
    first = min(start for start, _ in jobs)
    launched = _launched_at(res.stdout + res.stderr)
    said = _DONE_IN.search(res.stdout + res.stderr)
    return Run(
        wall,
        launched - started,
        first - launched,
        max(end for _, end in jobs) - first,
        rss[-1],
        statistics.median(deltas) if deltas else None,
        float(said.group(1)) if said else None,
    )


def median_run(runs: int, cmd: list[str], cwd: Path, env: dict[str, str]) -> Run:
    done = [run_once(cmd, cwd, env) for _ in range(runs)]
    return Run(
        statistics.median(r.wall for r in done),
        statistics.median(r.to_launch for r in done),
        statistics.median(r.to_first_job for r in done),
        statistics.median(r.jobs_phase for r in done),
        int(statistics.median(r.peak_rss for r in done)),
        done[len(done) // 2].job_cpu,
        done[len(done) // 2].said_done,
    )


def ray_fixed_cost(runs: int, init_options: list[str], cwd: Path) -> float:
    import yaml  # the values as Hydra reads them from the command line (false, 2, ...)

    pairs = (o.split("=", 1) for o in init_options)
    kwargs = ", ".join(f"{k}={yaml.safe_load(v)!r}" for k, v in pairs)
    code = f"import ray\nray.init({kwargs})\nray.shutdown()\n"
    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], cwd=cwd, check=True, capture_output=True)
        walls.append(time.perf_counter() - started)
    return statistics.median(walls)


@contextlib.contextmanager
def warm_ray(env: dict[str, str]) -> Iterator[dict[str, str]]:
    """`ray start --head` in a temp root of its own (RAY_TMPDIR, as /tmp/ray by
    default): sweeps given the environment it yields find it with nothing set."""
    root = tempfile.mkdtemp(prefix="rb", dir="/tmp")
    env = {**env, "RAY_TMPDIR": root}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ray = Path(sys.executable).parent / "ray"
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", f"--temp-dir={root}/ray"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        while not (Path(root) / "ray" / "ray_current_cluster").exists():
            if head.poll() is not None:
                sys.exit("ray start --head failed")
            time.sleep(0.5)
        time.sleep(3)  # its raylet registers shortly after
        yield env
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` stops what it started
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=10)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", root], check=False)


def job_spec_sizes(jobs: int, sample: int = 200) -> tuple[int, int]:
    """Bytes of the job spec a cluster launcher ships for `jobs` jobs of the
    app, built here as the launcher builds it (no cluster): as it is, and with
    every job's config composed on this machine (the design before the config
    snapshot; `sample` of them composed, the size scaled)."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext, RunMode

    from hydra_ray.core.jobs import Job, Policy
    from hydra_ray.driver.protocol import JobSpec
    from hydra_ray.engine.worker import (
        capture_sweep_state,
        compose_each,
        composed_here,
        dumps_for_cluster,
    )

    def task(cfg: object) -> None:
        pass

    def spec(n: int, composed: bool) -> int:
        batch = [Job(i, [f"i={i}"]) for i in range(n)]
        return len(
            dumps_for_cluster(
                JobSpec(
                    state=capture_sweep_state(context, task, master),
                    jobs=batch,
                    configs=(
                        compose_each(context, master, batch)
                        if composed
                        else composed_here(context, master, batch)
                    ),
                    init={},
                    sweep_dir="multirun",
                    code_dir=None,
                    policy=Policy(),
                    live=False,
                    width=None,
                    already_done=0,
                )
            )
        )

    with initialize_config_dir(str(APP.parent), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        context = HydraContext(config_loader=loader, callbacks=None)  # type: ignore[arg-type]
        master = loader.load_configuration("app", [], run_mode=RunMode.MULTIRUN)
        return spec(jobs, composed=False), spec(sample, composed=True) * jobs // sample


def plugin_at(rev: str, scratch: Path) -> Path:
    """A dir with this repository's packages as of commit `rev` (hydra_plugins, and
    hydra_ray where it has one): first on PYTHONPATH, they are the ones Hydra (and
    Ray's workers) import."""
    root = scratch / f"at-{rev}"
    root.mkdir()
    repo = Path(__file__).resolve().parent.parent
    tree = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "--name-only", rev],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    packages = [p for p in ("hydra_plugins", "hydra_ray") if p in tree]
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", rev, *packages], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--scenario", choices=list(SCENARIOS), action="append")
    parser.add_argument("--launcher", choices=list(LAUNCHERS), action="append")
    parser.add_argument(
        "--ray-at",
        metavar="REV",
        help="also run `ray` with this plugin as of the git commit REV (launcher 'ray @REV')",
    )
    parser.add_argument(
        "--ray-init",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a ray.init() option, given to our cold launcher and the fixed-cost run",
    )
    args = parser.parse_args()
    if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "hydra-joblib-launcher"], check=True
        )
    launchers = args.launcher or list(LAUNCHERS)
    ray_overrides = [f"hydra.launcher.ray.init.{o}" for o in args.ray_init]
    with tempfile.TemporaryDirectory() as scratch, contextlib.ExitStack() as stack:
        cwd = Path(scratch)
        # (The warm Ray's workers have its environment, not the sweep's: both name the file.)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "BENCH_TIMES": f"{cwd}/times.txt"}
        warm_env = stack.enter_context(warm_ray(env)) if "ray warm" in launchers else env
        envs = {launcher: warm_env if "warm" in launcher else env for launcher in launchers}
        if args.ray_at:
            launchers.append(f"ray @{args.ray_at}")
            envs[launchers[-1]] = {**env, "PYTHONPATH": str(plugin_at(args.ray_at, cwd))}
        fixed = ray_fixed_cost(max(args.runs, 3), args.ray_init, cwd)
        print(f"Ray's fixed cost (start + shut down, no jobs): {fixed:.2f} s (median of 3)")
        size, composed = job_spec_sizes(10_000)
        print(
            f"Cluster job spec at 10,000 jobs: {size / 2**20:.1f} MiB (with every config "
            f"composed here: {composed / 2**20:.0f} MiB, {composed / size:.0f}x)"
        )
        phases: dict[tuple[str, str], float] = {}
        for name in args.scenario or DEFAULT_SCENARIOS:
            title, sweep = SCENARIOS[name]
            print(f"\n{title}: median of {args.runs} run(s)")
            print(f"  {'':9s} {'wall':>9s} {'x basic':>8s} {'to launch()':>12s} "
                  f"{'to 1st job':>11s} {'jobs phase':>11s} {'peak RSS':>9s} "
                  f"{'CPU/job':>9s}")  # fmt: skip
            walls: dict[str, float] = {}
            said: dict[str, float | None] = {}
            for launcher in launchers:
                cold = launcher in ("ray", "ray per-job") or launcher.startswith("ray @")
                extra = ray_overrides if cold else []
                shape = LAUNCHERS["ray" if launcher.startswith("ray @") else launcher]
                cmd = [sys.executable, str(APP), "--multirun", *sweep, *shape]
                run = median_run(args.runs, cmd + extra, cwd, envs[launcher])
                walls[launcher] = run.wall
                phases[name, launcher] = run.jobs_phase
                ratio = f"{run.wall / walls['basic']:8.2f}" if "basic" in walls else f"{'':8s}"
                print(
                    f"  {launcher:9s} {run.wall:8.2f}s {ratio} {run.to_launch:11.2f}s "
                    f"{run.to_first_job:10.2f}s {run.jobs_phase:10.2f}s "
                    f"{run.peak_rss / 2**20:6.0f} MiB "
                    + (f"{run.job_cpu * 1000:6.1f} ms" if run.job_cpu is not None else "")
                )
                said[launcher] = run.said_done
            for ours, took in said.items():
                if took is not None:
                    print(f"  {ours}: the launcher's own line says: jobs done in {took:.1f} s")
            if "ray" in walls:
                print(f"  ray net of Ray's fixed cost: {walls['ray'] - fixed:.2f} s")
            then = f"ray @{args.ray_at}"
            if args.ray_at and "ray" in walls and (name, then) in phases:
                print(
                    f"  ray / {then}: wall {walls['ray'] / walls[then]:.2f}, jobs phase "
                    f"{phases[name, 'ray'] / phases[name, then]:.2f}"
                )
            for ours in ("ray", "ray warm"):
                if ours in walls and "joblib" in walls:
                    print(f"  {ours} / joblib: {walls[ours] / walls['joblib']:.2f}")
        for launcher in launchers:
            if ("trivial1000", launcher) in phases and ("trivial10000", launcher) in phases:
                grew = phases["trivial10000", launcher] / phases["trivial1000", launcher]
                print(f"\n{launcher}: jobs phase at 10,000 jobs / at 1,000: {grew:.1f} (flat: 10)")


if __name__ == "__main__":
    main()
