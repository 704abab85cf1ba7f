"""Whole-process wall time of the same Hydra sweep under Hydra's `basic` launcher,
the joblib launcher and our `ray` launcher, with ratios against `basic`.

Run by hand, on an otherwise idle machine:

    .venv/bin/python benchmarks/bench_launchers.py            # all scenarios, 3 runs each
    .venv/bin/python benchmarks/bench_launchers.py --runs 5 --scenario sleep20

Also measures Ray's own fixed cost in the same invocation: a process that starts
and shuts down a local Ray with the same `ray.init` options, and runs no job.
`hydra-joblib-launcher` is installed into this interpreter if it is missing.
"""

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

APP = Path(__file__).with_name("app.py")

SCENARIOS = {
    "sleep20": ("20 jobs that each sleep 1 s", ["seconds=1", "i=range(0,20)"]),
    "trivial1000": ("1000 trivial jobs", ["i=range(0,1000)"]),
    "trivial1": ("1 trivial job", ["i=0"]),
}
LAUNCHERS = {
    "basic": ["hydra/launcher=basic"],
    "joblib": ["hydra/launcher=joblib"],
    "ray": ["hydra/launcher=ray"],
}


def timed(cmd: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - started
    if res.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
    return took


def median_of(runs: int, cmd: list[str], cwd: Path) -> float:
    return statistics.median(timed(cmd, cwd) for _ in range(runs))


def ray_fixed_cost(runs: int, init_options: list[str], cwd: Path) -> float:
    kwargs = ", ".join(f"{k}={v}" for k, v in (o.split("=", 1) for o in init_options))
    code = f"import ray\nray.init({kwargs})\nray.shutdown()\n"
    return median_of(runs, [sys.executable, "-c", code], cwd)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), action="append")
    parser.add_argument(
        "--ray-init",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a ray.init() option, given to both our launcher and the fixed-cost run",
    )
    args = parser.parse_args()
    if importlib.util.find_spec("hydra_plugins.hydra_joblib_launcher") is None:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "hydra-joblib-launcher"], check=True
        )
    ray_overrides = [f"hydra.launcher.ray.init.{o}" for o in args.ray_init]
    with tempfile.TemporaryDirectory() as scratch:
        cwd = Path(scratch)
        fixed = ray_fixed_cost(args.runs, args.ray_init, cwd)
        print(
            f"Ray's fixed cost (start + shut down, no jobs): {fixed:.2f} s (median of {args.runs})"
        )
        for name in args.scenario or list(SCENARIOS):
            title, sweep = SCENARIOS[name]
            print(f"\n{title}: median wall of {args.runs} runs")
            walls: dict[str, float] = {}
            for launcher, overrides in LAUNCHERS.items():
                extra = ray_overrides if launcher == "ray" else []
                cmd = [sys.executable, str(APP), "--multirun", *sweep, *overrides, *extra]
                walls[launcher] = median_of(args.runs, cmd, cwd)
                ratio = walls[launcher] / walls["basic"]
                print(f"  {launcher:7s} {walls[launcher]:8.2f} s   {ratio:5.2f} x basic")
            net = walls["ray"] - fixed
            print(
                f"  ray net of Ray's fixed cost: {net:.2f} s; "
                f"ray / joblib: {walls['ray'] / walls['joblib']:.2f}"
            )


if __name__ == "__main__":
    main()
