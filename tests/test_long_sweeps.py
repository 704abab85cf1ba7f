"""Long sweeps, as a user watches and relies on them: progress lines and the live
display, the summary (table and sweep_summary.json), per-job timeouts, retries,
and resuming an interrupted sweep. Real Hydra apps as subprocesses, on the test
session's real Ray."""

import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import APPS, SMALL_RAY, run_app, run_app_in_pty, start_app

ESCAPE = "\x1b"


def _summary(sweep: Path) -> dict[str, Any]:
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert isinstance(summary, dict)
    return summary


def _jobs(sweep: Path) -> dict[int, dict[str, Any]]:
    return {job["idx"]: job for job in _summary(sweep)["jobs"]}


def _runs(out: Path, num: int) -> int:
    """How many times job `num` ran (each run appends a line)."""
    path = out / f"runs_{num}"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_progress_lines_and_summary_when_not_a_terminal(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2,3",
        "raise_on=[2]",
        "seconds=0.5",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode != 0  # Hydra raises the failed job's error at the end
    # Piped output: plain lines, not one control sequence.
    assert ESCAPE not in res.output
    for num, x in enumerate((1, 2, 3)):
        assert re.search(rf"#{num} : x={x} \S+ seconds=0.5 started on \S+", res.output)
        assert re.search(rf"\[\d/3\] #{num} : x={x} ", res.output)
    assert "FAILED after" in res.output and "ValueError: job 1 was told to raise" in res.output
    # The summary table: a header and one row per job with its status.
    header = next(line for line in res.output.splitlines() if "overrides" in line)
    for column in ("#", "status", "duration", "attempts", "node", "error"):
        assert column in header
    assert re.search(r"\| 1 \| x=2 .*\| failed .*ValueError: job 1 was told to raise", res.output)
    assert re.search(r"\| 0 \| x=1 .*\| succeeded ", res.output)
    # ...and the same as JSON in the sweep dir, the failed job with its error.
    summary = _summary(sweep)
    assert summary["counts"] == {"succeeded": 2, "failed": 1}
    jobs = _jobs(sweep)
    assert [jobs[i]["status"] for i in range(3)] == ["succeeded", "failed", "succeeded"]
    assert jobs[1]["error"] == "ValueError: job 1 was told to raise"
    assert jobs[0]["error"] is None and jobs[0]["return_value"] == 10
    assert jobs[2]["overrides"] == ["x=3", "raise_on=[2]", "seconds=0.5"]
    assert jobs[2]["output_dir"] == str(sweep / "2")
    assert all(j["attempts"] == 1 and j["node"] and j["duration_s"] >= 0.5 for j in jobs.values())
    # The hint to run what failed again.
    assert f"hydra.sweep.dir={sweep} hydra.launcher.resume=true" in res.output


def test_progress_false_gives_lines_even_on_a_terminal(ray_session: str, tmp_path: Path) -> None:
    res = run_app_in_pty(
        "app.py",
        "x=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.progress=false",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert "[2/2] #" in res.output
    # No live display: nothing moves the cursor or clears a line.
    assert "\x1b[1A" not in res.output and "\x1b[2K" not in res.output


def test_live_display_on_a_terminal(ray_session: str, tmp_path: Path) -> None:
    res = run_app_in_pty(
        "app.py",
        "x=1,2,3,4",
        "seconds=1.5",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", res.output)
    # The display is redrawn in place: the cursor goes up over it, lines are cleared.
    assert "\x1b[1A" in res.output and "\x1b[2K" in res.output
    # Its status line, at several stages, with counts and times.
    stages = set(re.findall(r"(\d)/4 jobs · (\d) running · (\d) queued", plain))
    assert len(stages) >= 3, stages
    assert ("4", "0", "0") in stages
    assert re.search(
        r"0/4 jobs · \d running · \d queued · 0 succeeded · 0 failed · 0:0\d elapsed", plain
    )
    assert re.search(r"\d/4 jobs .* elapsed · ~\d+:\d\d left", plain)
    # The latest job events in it, and the log lines above it, readable.
    assert re.search(r"#\d : x=\d seconds=1.5 started on \S+", plain)
    assert re.search(r"\[HYDRA\] \[4/4\] #\d : x=\d seconds=1.5 succeeded in", plain)
    # The final summary table, after the display.
    tail = plain[plain.rindex("4/4 jobs") :]
    assert re.search(r"#\s+overrides\s+status\s+duration\s+attempts\s+node\s+error", tail)
    for num in range(4):
        assert re.search(rf"\n\s*{num}\s+x={num + 1} seconds=1.5\s+succeeded\s", tail)


def test_a_job_past_its_timeout_is_cancelled_and_the_others_go_on(
    ray_session: str, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2,3",
        "slow_first=[2]",  # job 1 sleeps 60 s
        "seconds=0.5",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.job_timeout_s=4",
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert "timed out after 4 s" in res.output
    jobs = _jobs(sweep)
    assert [jobs[i]["status"] for i in range(3)] == ["succeeded", "timed out", "succeeded"]
    assert "timed out after 4 s" in jobs[1]["error"]
    assert jobs[1]["node"] == jobs[0]["node"]  # where it ran, from its start event
    # The catchable stop at 4 s reaches a job in time.sleep only when the sleep
    # ends: it is cancelled by force after hydra.launcher.stop_grace_s (10 s),
    # not before, and not left to sleep its 60 s.
    assert 14 <= jobs[1]["duration_s"] < 60
    # It was cancelled, not left to finish: it never wrote its result.
    time.sleep(1)
    assert not (sweep / "1" / "done_1.json").exists()


def test_a_job_that_raises_once_succeeds_on_its_retry(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2",
        "fail_first=[2]",  # job 1 raises the first time it runs
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.retries=1",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    jobs = _jobs(sweep)
    assert (jobs[0]["status"], jobs[0]["attempts"]) == ("succeeded", 1)
    assert (jobs[1]["status"], jobs[1]["attempts"]) == ("succeeded", 2)
    assert jobs[1]["return_value"] == 20
    assert "attempt 1 failed" in res.output and "running it again (attempt 2)" in res.output
    assert re.search(r"\| 1 \| x=2 .*\| succeeded \|.*\|\s+2 \|", res.output)
    # Both attempts ran in the same job dir; its log says which attempt is which.
    assert _runs(sweep / "1", 1) == 2
    log = (sweep / "1" / "app.log").read_text()
    assert "attempt 1 of 2" in log and "RuntimeError: job 1 fails its first run" in log
    assert log.index("attempt 2 of 2") > log.index("job 1 fails its first run")


def test_without_retries_a_job_that_raises_once_fails(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=2",
        "fail_first=[2]",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert _jobs(sweep)[0]["status"] == "failed" and _runs(sweep / "0", 0) == 1


def test_an_interrupted_sweep_resumes_without_running_finished_jobs_again(
    ray_session: str, tmp_path: Path
) -> None:
    out = tmp_path / "counters"  # outside the sweep dir: each job counts its runs here
    sweep = tmp_path / "sweep"
    overrides = [
        "x=1,2,3,4,5,6",
        # Jobs #2 and #3 sleep 60 s on their first run: #4 and #5 wait for a CPU.
        "slow_first=[3,4]",
        "seconds=0.5",
        f"out={out}",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.stop_grace_s=1",  # the sleeping jobs see no KeyboardInterrupt
    ]
    with start_app("app.py", *overrides, f"hydra.sweep.dir={sweep}", cwd=tmp_path) as run:
        records = sweep / ".hydra_ray"
        # Jobs #0 and #1 finished (the launcher recorded them); slow ones are running.
        run.wait_until(
            lambda: (records / "job_0.pkl").exists() and (records / "job_1.pkl").exists(),
            120,
            "jobs #0 and #1",
        )
        run.wait_until(lambda: (out / "started_2").exists(), 60, "job #2 to start")
        time.sleep(1)  # its start event reaches the driver
        first = run.end(signal.SIGINT, timeout=60)
    assert run.returncode != 0
    interrupted = _jobs(sweep)
    assert [interrupted[i]["status"] for i in (0, 1)] == ["succeeded", "succeeded"]
    assert {interrupted[i]["status"] for i in range(2, 6)} == {"interrupted"}
    # A job interrupted while it ran names its node; a queued one has none.
    assert interrupted[2]["node"] is not None and interrupted[4]["node"] is None
    assert "hydra.launcher.resume=true" in first
    runs_before = {num: _runs(out, num) for num in range(6)}
    assert runs_before[0] == runs_before[1] == 1 and runs_before[2] == 1

    res = run_app(
        "app.py", *overrides, f"hydra.sweep.dir={sweep}", "hydra.launcher.resume=true", cwd=tmp_path
    )
    assert res.returncode == 0, res.output
    assert "Resuming: 2 of 6 jobs succeeded in the earlier run" in res.output
    # The finished jobs did not run again; every other job ran once more.
    assert [_runs(out, num) - runs_before[num] for num in range(6)] == [0, 0, 1, 1, 1, 1]

    # The results equal those of the same sweep run without interruption.
    plain_sweep = tmp_path / "uninterrupted"
    plain = run_app(
        "app.py",
        *[o for o in overrides if not o.startswith(("out=", "slow_first="))],
        f"out={tmp_path / 'counters2'}",
        f"hydra.sweep.dir={plain_sweep}",
        cwd=tmp_path,
    )
    assert plain.returncode == 0, plain.output
    resumed, uninterrupted = _jobs(sweep), _jobs(plain_sweep)

    def results(jobs: dict[int, dict[str, Any]]) -> list[tuple[Any, ...]]:
        return [(j["status"], j["return_value"], j["overrides"][0]) for j in jobs.values()]

    assert results(resumed) == results(uninterrupted)
    assert [resumed[i]["resumed"] for i in range(6)] == [True, True, False, False, False, False]


def test_resume_with_other_overrides_is_refused(ray_session: str, tmp_path: Path) -> None:
    out, sweep = tmp_path / "counters", tmp_path / "sweep"
    common = [
        f"out={out}",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
    ]
    assert run_app("app.py", "x=1,2", *common, cwd=tmp_path).returncode == 0
    res = run_app("app.py", "x=1,3", *common, "hydra.launcher.resume=true", cwd=tmp_path)
    assert res.returncode != 0
    assert "hydra.launcher.resume=true refused" in res.output
    assert "['x=1,2', " in res.output and "['x=1,3', " in res.output
    # Refused before anything ran.
    assert (_runs(out, 0), _runs(out, 1)) == (1, 1)
    assert "Initializing ray" not in res.output


def test_resume_of_a_dir_without_a_sweep_runs_every_job(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.resume=true",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    assert "holds no earlier sweep" in res.output
    assert [j["status"] for j in _jobs(sweep).values()] == ["succeeded", "succeeded"]


def test_bad_values_are_refused_naming_the_key(tmp_path: Path) -> None:
    for override, key in (
        ("hydra.launcher.retries=-1", "hydra.launcher.retries=-1"),
        ("hydra.launcher.job_timeout_s=0", "hydra.launcher.job_timeout_s=0"),
        # Ray itself checks a strategy's name only when a task is submitted.
        (
            "hydra.launcher.ray.remote.scheduling_strategy=spread",
            "hydra.launcher.ray.remote.scheduling_strategy=spread",
        ),
    ):
        res = run_app("app.py", "x=1", override, cwd=tmp_path, timeout=60)
        assert res.returncode != 0
        assert f"{key}" in res.output and "is not valid" in res.output, res.output
        assert "Initializing ray" not in res.output


def test_a_timeout_of_nan_or_inf_is_refused_before_ray_starts(tmp_path: Path) -> None:
    for value, fix in (("nan", "or to null for no limit"), ("inf", "null for no limit (not inf)")):
        res = run_app(
            "app.py", "x=1", f"hydra.launcher.job_timeout_s={value}", *SMALL_RAY, cwd=tmp_path
        )
        assert res.returncode != 0
        assert f"hydra.launcher.job_timeout_s={value} is not valid" in res.output, res.output
        assert fix in res.output
        assert "Initializing ray" not in res.output


def test_summary_of_nan_and_infinite_return_values_is_strict_json(
    ray_session: str, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2",
        "returns=[nan,{loss:inf,curve:[0.5,-inf]}]",
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    text = (sweep / "sweep_summary.json").read_text()

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    jobs = json.loads(text, parse_constant=refuse)["jobs"]
    assert jobs[0]["return_value"] == "NaN"
    assert jobs[1]["return_value"] == {"loss": "Infinity", "curve": [0.5, "-Infinity"]}
    if shutil.which("jq"):
        jq = subprocess.run(
            ["jq", "-c", "[.jobs[].return_value]"], input=text, capture_output=True, text=True
        )
        assert jq.returncode == 0, jq.stderr
        assert jq.stdout.strip() == '["NaN",{"loss":"Infinity","curve":[0.5,"-Infinity"]}]'


def test_the_summary_gets_the_mode_of_the_users_umask_records_are_0600(
    ray_session: str, tmp_path: Path
) -> None:
    for umask, mode in ((0o077, 0o600), (0o022, 0o644)):
        sweep = tmp_path / f"sweep_{umask:o}"
        overrides = [f"hydra.sweep.dir={sweep}", f"hydra.launcher.ray.init.address={ray_session}"]
        res = subprocess.run(
            [sys.executable, str(APPS / "app.py"), "--multirun", "x=1", *overrides],
            cwd=tmp_path,
            umask=umask,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=180,
        )
        assert res.returncode == 0, res.stdout
        assert oct((sweep / "sweep_summary.json").stat().st_mode & 0o777) == oct(mode), umask
        # They hold the overrides and configs as run, secrets too: this user's only.
        for path in (".hydra_ray/sweep.json", ".hydra_ray/job_0.pkl"):
            assert oct((sweep / path).stat().st_mode & 0o777) == oct(0o600), (umask, path)


def test_long_sweep_example_jobs_continue_from_their_checkpoint_on_retry(
    ray_session: str, tmp_path: Path
) -> None:
    example = Path(__file__).parents[1] / "examples" / "long_sweep"
    sweep = tmp_path / "sweep"
    cmd = [sys.executable, str(example / "train.py"), "--multirun", "seconds_per_epoch=0.1"]
    cmd += [f"hydra.sweep.dir={sweep}", f"hydra.launcher.ray.init.address={ray_session}"]
    res = subprocess.run(
        cmd,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    jobs = _jobs(sweep)
    lrs = [0.1, 0.03, 0.01, 0.003]
    assert [(j["status"], j["attempts"]) for j in jobs.values()] == [("succeeded", 2)] * 4
    for num, lr in enumerate(lrs):
        # Six epochs in all: two before the simulated preemption, four after it.
        assert abs(jobs[num]["return_value"] - (1 - lr) ** 6) < 1e-9
        log = (sweep / str(num) / "train.log").read_text()
        assert "Continuing from the checkpoint of epoch 2" in log
        assert log.count("epoch 1: loss") == 1


# "local" is ray.init()'s own word for a new local Ray, not a cluster's address.
@pytest.mark.parametrize("address", [[], ["hydra.launcher.ray.init.address=local"]])
def test_jobs_no_node_can_run_are_refused_instead_of_waiting_forever(
    tmp_path: Path, address: list[str]
) -> None:
    res = run_app(
        "app.py",
        "x=1,2",
        *address,
        "hydra.launcher.ray.init.num_cpus=1",
        "hydra.launcher.ray.init.include_dashboard=false",
        "hydra.launcher.ray.remote.num_cpus=2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
        timeout=120,
    )
    assert res.returncode != 0
    assert "No job can run on this Ray: each job asks for {'CPU': 2.0}" in res.output
    assert "the most any node has is {'CPU': 1.0}" in res.output
    assert "hydra.launcher.ray.remote.num_cpus" in res.output
    assert not list((tmp_path / "sweep").glob("*/.hydra"))  # no job ran


def test_a_batched_sweeper_gets_each_batchs_table_once(ray_session: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,2,3,4,5,6",
        "raise_on=[5]",
        "hydra/sweeper=basic",
        "hydra.sweeper.max_batch_size=2",
        f"hydra.launcher.ray.init.address={ray_session}",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert res.returncode != 0  # job #4 raises
    rows = re.findall(r"^\| (\d+) \|", res.output, flags=re.MULTILINE)
    # Three tables of two rows: each job once, not the sweep so far after each batch.
    assert sorted(rows) == ["0", "1", "2", "3", "4", "5"], res.output
    assert "The sweep so far: 6 jobs (1 failed, 5 succeeded)" in res.output
    assert len(_summary(sweep)["jobs"]) == 6
