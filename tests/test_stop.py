"""A job past `job_timeout_s`, or running at Ctrl-C, gets a chance to save its
work: a catchable stop (KeyboardInterrupt in the job) first, the forced cancel
`stop_grace_s` later; with `retry_timed_out`, its next attempt continues from
what it saved."""

import json
import signal
import time
from pathlib import Path
from typing import Any

from .conftest import AppRun, processes_in_session, run_app, start_app


def _one_job(ray_session: str) -> list[str]:
    """checkpoint_app.py's overrides for one job on the session's Ray, its sweep dir `sweep`."""
    return ["+n=1", f"hydra.launcher.ray.init.address={ray_session}", "hydra.sweep.dir=sweep"]


def _checkpoint_sweep(ray_session: str, tmp_path: Path, *overrides: str) -> AppRun:
    """The one job with a 3 s timeout, run to the end."""
    return run_app(
        "checkpoint_app.py",
        *_one_job(ray_session),
        "hydra.launcher.job_timeout_s=3",
        *overrides,
        cwd=tmp_path,
    )


def _job(tmp_path: Path) -> dict[str, Any]:
    job: dict[str, Any] = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())[
        "jobs"
    ][0]
    return job


def test_a_job_past_its_timeout_saves_a_checkpoint_before_it_is_cancelled(
    ray_session: str, tmp_path: Path
) -> None:
    res = _checkpoint_sweep(ray_session, tmp_path)
    assert res.returncode != 0, res.output
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "checkpoint").is_file(), res.output
    assert not (job_dir / "done").exists()
    assert "stopping it (KeyboardInterrupt in the job)" in res.output
    job = _job(tmp_path)
    assert job["status"] == "timed out" and "timed out after 3 s" in job["error"]


def test_with_retry_timed_out_the_next_attempt_continues_from_the_checkpoint(
    ray_session: str, tmp_path: Path
) -> None:
    res = _checkpoint_sweep(
        ray_session, tmp_path, "hydra.launcher.retry_timed_out=true", "hydra.launcher.retries=1"
    )
    assert res.returncode == 0, res.output
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "resumed").read_text() == (job_dir / "checkpoint").read_text()
    job = _job(tmp_path)
    assert (job["status"], job["attempts"], job["return_value"]) == ("succeeded", 2, "resumed")


def test_a_job_that_ignores_the_stop_is_cancelled_by_force_after_the_grace(
    ray_session: str, tmp_path: Path
) -> None:
    res = _checkpoint_sweep(
        ray_session, tmp_path, "ignore_stop=true", "hydra.launcher.stop_grace_s=2"
    )
    assert res.returncode != 0, res.output
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "stop_ignored").is_file(), res.output
    assert not (job_dir / "done").exists() and not (job_dir / "checkpoint").exists()
    assert _job(tmp_path)["status"] == "timed out"


def test_a_grace_that_cannot_work_is_refused_naming_the_key(tmp_path: Path) -> None:
    res = run_app("checkpoint_app.py", "+n=1", "hydra.launcher.stop_grace_s=-1", cwd=tmp_path)
    assert res.returncode != 0
    assert "hydra.launcher.stop_grace_s=-1.0 is not valid" in res.output, res.output
    assert "Initializing ray" not in res.output


def _interrupted(ray_session: str, tmp_path: Path, *overrides: str, presses: int = 1) -> str:
    """Ctrl-C (`presses` times, a second apart) once job #0 works; its output."""
    with start_app("checkpoint_app.py", *_one_job(ray_session), *overrides, cwd=tmp_path) as run:
        working = tmp_path / "sweep" / "0" / "working"
        run.wait_until(working.exists, 120, "job #0 working")
        for press in range(presses):
            if press:
                time.sleep(1)
            run.send(signal.SIGINT)
        # The app works for 60 s: an exit before then is the stop's doing.
        assert run.wait(timeout=50) != 0, run.output
        output = run.output
        assert processes_in_session(run.pid) == []
    return output


def test_ctrl_c_lets_a_running_job_save_a_checkpoint_and_a_resume_continues_from_it(
    ray_session: str, tmp_path: Path
) -> None:
    output = _interrupted(ray_session, tmp_path)
    assert "Asked 1 running jobs to stop (KeyboardInterrupt in each" in output, output
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "checkpoint").is_file(), output
    assert not (job_dir / "done").exists()
    assert _job(tmp_path)["status"] == "interrupted"
    res = run_app(
        "checkpoint_app.py", *_one_job(ray_session), "hydra.launcher.resume=true", cwd=tmp_path
    )
    assert res.returncode == 0, res.output
    assert (job_dir / "resumed").read_text() == (job_dir / "checkpoint").read_text()


def test_after_ctrl_c_a_job_that_ignores_the_stop_is_cancelled_by_force_after_the_grace(
    ray_session: str, tmp_path: Path
) -> None:
    output = _interrupted(
        ray_session, tmp_path, "ignore_stop=true", "hydra.launcher.stop_grace_s=2"
    )
    job_dir = tmp_path / "sweep" / "0"
    assert (job_dir / "stop_ignored").is_file(), output
    assert not (job_dir / "checkpoint").exists() and not (job_dir / "done").exists()
    assert "Interrupted again" not in output


def test_a_second_ctrl_c_cancels_by_force_without_waiting_for_the_grace(
    ray_session: str, tmp_path: Path
) -> None:
    # A grace longer than the app works: only the second Ctrl-C can end it sooner.
    output = _interrupted(
        ray_session,
        tmp_path,
        "ignore_stop=true",
        "hydra.launcher.stop_grace_s=600",
        presses=2,
    )
    assert "Interrupted again: cancelling the 1 running jobs by force" in output, output
    assert (tmp_path / "sweep" / "0" / "stop_ignored").is_file(), output
