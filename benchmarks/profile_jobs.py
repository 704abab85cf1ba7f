"""Where a trivial job's time goes: the benchmark app's sweep on the `ray`
launcher (or another), sampled with py-spy in the launching process and in
every Ray worker, and each function's inclusive share printed as CPU
milliseconds per job, workers and the launching process apart.

Run by hand (py-spy needs ptrace: root, or a container that allows it):

    .venv/bin/pip install py-spy
    .venv/bin/python benchmarks/profile_jobs.py --jobs 300
    .venv/bin/python benchmarks/profile_jobs.py --jobs 300 --launcher joblib

Samples are taken only while a thread is on CPU (py-spy without --idle), so
the milliseconds are CPU time, not waiting.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

APP = Path(__file__).with_name("app.py")
REPO = Path(__file__).resolve().parents[1]
RATE = 100  # samples a second

# py-spy's raw frames: "function (file:line)"; the first names the process.
_FRAME = re.compile(r"^(?P<fn>.+?) \((?P<file>[^()]*?)(?::\d+)?\)$")


def _frame_name(frame: str) -> str:
    """ "run_job (hydra/core/utils.py)": the function and its file below site-packages."""
    found = _FRAME.match(frame.strip())
    if not found:
        return frame.strip()
    file = found["file"]
    for marker in ("site-packages/", f"{REPO}/"):
        file = file.split(marker, 1)[-1]
    file = re.sub(r"^.*/lib/python3\.\d+/", "", file)
    return f"{found['fn']} ({file})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--launcher", default="ray")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("overrides", nargs="*", help="more overrides for the sweep")
    args = parser.parse_args()
    py_spy = Path(sys.executable).with_name("py-spy")
    with tempfile.TemporaryDirectory() as scratch:
        raw = Path(scratch) / "profile.txt"
        cmd = [
            str(py_spy), "record", "--subprocesses", "--format", "raw", "--rate", str(RATE),
            "--output", str(raw), "--", sys.executable, str(APP), "--multirun",
            f"i=range(0,{args.jobs})", f"hydra/launcher={args.launcher}", *args.overrides,
        ]  # fmt: skip
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        res = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, env=env)
        if res.returncode != 0 or not raw.exists():
            sys.exit(f"py-spy failed:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}")
        lines = raw.read_text().splitlines()
    sides = ("workers", "launcher", "Ray's own processes")
    inclusive = {side: collections.Counter[str]() for side in sides}
    totals: collections.Counter[str] = collections.Counter()
    for line in lines:
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        entries = stack.split(";")
        # py-spy names the sampled process after its ancestors: "process PID:"CMD"".
        processes = [e for e in entries if e.startswith("process ")]
        frames = [e for e in entries if not e.startswith("process ")]
        if "default_worker.py" in processes[-1] or "loky" in processes[-1]:
            side = "workers"
        elif len(processes) == 1:
            side = "launcher"
        else:
            side = "Ray's own processes"  # raylet, GCS, dashboard and its agents
        totals[side] += int(count)
        for name in {_frame_name(f) for f in frames}:
            inclusive[side][name] += int(count)
    per_job_ms = 1000 / RATE / args.jobs
    for side in sides:
        print(f"\n{side}: {totals[side] * per_job_ms:.1f} ms of CPU per job in all")
        for name, samples in inclusive[side].most_common(args.top):
            print(f"  {samples * per_job_ms:7.2f} ms  {name}")


if __name__ == "__main__":
    main()
