"""Outputs that did not come home are never deleted: when the transfers home are
interrupted or fail, the cluster and the head's temp dir stay, the run fails, and
the commands it prints bring the outputs home and tear the cluster down; a second
Ctrl-C tears down anyway."""

import os
import re
import shlex
import shutil
import signal
import stat
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from ..cluster_harness.fake_hosts import FakeHosts, launcher_env
from .test_cluster_faults import _end
from .test_cluster_launcher import NetnsApp, _cluster_yaml, _run_test_app

MIB = 2**20
# Two jobs of 12 MiB each, brought home at 1 MiB/s: ~24 s to interrupt them in
# (small: every copy of them on the way, worker to head to here, costs time).
JOB_MIB = 12
SLOW_KIB_S = 1024


def _slow_rsync_env(tmp_path: Path) -> dict[str, str]:
    """A PATH whose first `rsync` is the real one with --bwlimit, for the launching
    process only: its transfers home take long enough to be interrupted."""
    slow = tmp_path / "slow-bin"
    slow.mkdir()
    wrapper = slow / "rsync"
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("rsync")} --bwlimit={SLOW_KIB_S} "$@"\n')
    wrapper.chmod(0o755)
    return {"PATH": f"{slow}:{os.environ['PATH']}"}


_KEEP_LONGER = "To keep it longer:"


def _printed_commands(output: str, *, keep_longer: bool = False) -> list[list[str]]:
    """The `ray ...` commands the launcher printed to finish the job, in order (not
    Ray's own hints from when it created the cluster); or, with `keep_longer`,
    the one that keeps the cluster past its autodown deadline."""
    message = output.split("NOT ALL OUTPUTS ARE HOME", 1)[1]
    finish, _, longer = message.partition(_KEEP_LONGER)
    commands = re.findall(
        r"^\s+(ray (?:rsync-down|exec|down -y) .+)$", longer if keep_longer else finish, re.M
    )
    return [shlex.split(c) for c in commands]


def _run_printed(hosts: FakeHosts, tmp_path: Path, cmd: list[str]) -> None:
    """Run a printed command as a user would, from a shell with Ray's CLI on PATH,
    where the launching process could reach the cluster."""
    env = launcher_env(tmp_path, {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    res = hosts.run_in_netns(cmd, env=env, timeout=300)
    assert res.returncode == 0, f"{shlex.join(cmd)}:\n{res.stdout}"


def _head_tmp(hosts: FakeHosts, output: str) -> Path:
    found = re.search(r"Remote temp dir on the head: (\S+)", output)
    assert found, output
    return hosts.host_path("head", found.group(1))


def _interrupted_while_outputs_come_home(
    hosts: FakeHosts, tmp_path: Path, sig: signal.Signals = signal.SIGINT
) -> NetnsApp:
    """A sweep of two jobs that each write JOB_MIB MiB on the worker, sent `sig`
    (Ctrl-C: SIGINT) a few seconds into the (slow) transfer of their outputs from
    the head."""
    run = NetnsApp(
        hosts,
        tmp_path,
        "x=1,2",
        f"mb={JOB_MIB}",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(hosts, tmp_path, 'kept')}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        script="big_output.py",
        env=_slow_rsync_env(tmp_path),
    )
    # rsync's temp file of a job's big output, in the local sweep dir: under way.
    run.wait_until(
        lambda: bool(list((tmp_path / "sweep" / "0").glob(".big.bin.*"))),
        timeout=300,
        what="job #0's output coming home",
    )
    run.send(sig)
    if sig == signal.SIGINT:
        run.wait_for("Ctrl-C again within", timeout=60)
    return run


def _kept_on_the_head(
    hosts: FakeHosts, run: NetnsApp, why: str = "Ctrl-C interrupted the transfers home"
) -> None:
    """The records came home first; the outputs did not (the rsync was cut), and
    they are all in the head's temp dir, kept, with the job spec private to the user."""
    sweep = run.tmp_path / "sweep"
    assert f"NOT ALL OUTPUTS ARE HOME: {why}" in run.output
    assert sorted(p.name for p in (sweep / ".hydra_ray").glob("job_*.pkl")) == [
        "job_0.pkl",
        "job_1.pkl",
    ]
    home = [sweep / str(n) / "big.bin" for n in range(2)]
    assert not all(p.is_file() and p.stat().st_size == JOB_MIB * MIB for p in home), run.output
    head_tmp = _head_tmp(hosts, run.output)
    head_sweep = head_tmp / "sweep"  # an absolute sweep dir lives in the temp dir there
    for num in range(2):
        assert (head_sweep / str(num) / "big.bin").stat().st_size == JOB_MIB * MIB
    assert stat.S_IMODE((head_tmp / "job_spec.pkl").stat().st_mode) == 0o600


@pytest.fixture
def cleanup_hosts(fake_hosts: FakeHosts) -> Iterator[list[NetnsApp]]:
    runs: list[NetnsApp] = []
    yield runs
    _end(fake_hosts, *runs)


def test_ctrl_c_while_outputs_come_home_keeps_them_on_the_cluster_with_commands_that_finish(
    fake_hosts: FakeHosts, tmp_path: Path, cleanup_hosts: list[NetnsApp]
) -> None:
    run = _interrupted_while_outputs_come_home(fake_hosts, tmp_path)
    cleanup_hosts.append(run)
    assert run.wait(timeout=60) == 130, run.output
    _kept_on_the_head(fake_hosts, run)
    assert "Stopping cluster" not in run.output
    assert fake_hosts.ray_processes("head"), "the cluster was torn down"

    commands = _printed_commands(run.output)
    assert [c[:2] for c in commands] == [["ray", "rsync-down"], ["ray", "down"]], run.output
    # The cluster would tear itself down with them at a time the message names;
    # the printed command keeps it: its watchdog on the head is gone.
    assert "the cluster tears itself down at " in run.output, run.output
    (keep,) = _printed_commands(run.output, keep_longer=True)
    assert [p for p in fake_hosts.processes("head") if "autodown" in p.cmdline] != []
    _run_printed(fake_hosts, tmp_path, keep)
    assert [p for p in fake_hosts.processes("head") if "autodown" in p.cmdline] == []
    _run_printed(fake_hosts, tmp_path, commands[0])
    for num in range(2):
        done = tmp_path / "sweep" / str(num) / "big.bin"
        assert done.stat().st_size == JOB_MIB * MIB
    _run_printed(fake_hosts, tmp_path, commands[1])
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=60) == [], host


def test_a_second_ctrl_c_tears_the_cluster_down_anyway(
    fake_hosts: FakeHosts, tmp_path: Path, cleanup_hosts: list[NetnsApp]
) -> None:
    run = _interrupted_while_outputs_come_home(fake_hosts, tmp_path)
    cleanup_hosts.append(run)
    run.send(signal.SIGINT)
    assert run.wait(timeout=120) == 130, run.output
    _kept_on_the_head(fake_hosts, run)
    assert "Second Ctrl-C: tearing the cluster down anyway" in run.output
    assert "Deleted the cluster" in run.output
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=60) == [], host


def test_sigterm_while_outputs_come_home_ends_the_run_at_once_and_keeps_them_on_the_cluster(
    fake_hosts: FakeHosts, tmp_path: Path, cleanup_hosts: list[NetnsApp]
) -> None:
    # A batch system's or `kill`'s SIGTERM: the run ends now, as it was told, but
    # the head holds the only copy of the outputs, so the cluster stays.
    run = _interrupted_while_outputs_come_home(fake_hosts, tmp_path, signal.SIGTERM)
    cleanup_hosts.append(run)
    assert run.wait(timeout=60) == 128 + signal.SIGTERM, run.output
    _kept_on_the_head(fake_hosts, run, "a signal stopped the transfers home")
    assert "Stopping cluster" not in run.output and "Ctrl-C again" not in run.output
    assert fake_hosts.ray_processes("head"), "the cluster was torn down"
    commands = _printed_commands(run.output)
    assert [c[:2] for c in commands] == [["ray", "rsync-down"], ["ray", "down"]], run.output
    _run_printed(fake_hosts, tmp_path, commands[1])  # the user gives up on the outputs
    for host in ("head", "worker"):
        assert fake_hosts.wait_no_ray_processes(host, timeout=60) == [], host


def test_outputs_that_cannot_be_written_home_fail_the_run_and_stay_on_the_cluster(
    fake_hosts: FakeHosts, tmp_path: Path, cleanup_hosts: list[NetnsApp]
) -> None:
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where sync_down's target dir should be made")
    target = blocked / "outputs"
    res = _run_test_app(
        fake_hosts,
        tmp_path,
        _cluster_yaml(fake_hosts, tmp_path, "unw"),
        "x=1,2",
        f"hydra.launcher.sync_down.target_dir={target}",
    )
    assert res.returncode != 0, res.stdout
    assert "the outputs did not come home" in res.stdout
    assert "NOT ALL OUTPUTS ARE HOME" in res.stdout
    assert "Stopping cluster" not in res.stdout
    # The records come home first, into the sweep dir, whatever sync_down's target.
    sweep = tmp_path / "sweep"
    assert (sweep / ".hydra_ray" / "job_0.pkl").is_file() and (
        sweep / ".hydra_ray" / "job_1.pkl"
    ).is_file()

    commands = _printed_commands(res.stdout)
    assert [c[:2] for c in commands] == [["ray", "rsync-down"], ["ray", "down"]], res.stdout
    # The user fixes what stood in the way, then runs the commands.
    blocked.unlink()
    blocked.mkdir()
    _run_printed(fake_hosts, tmp_path, commands[0])
    for num in range(2):
        assert (target / str(num) / f"done_{num}.json").is_file()
    _run_printed(fake_hosts, tmp_path, commands[1])
    _no_leftovers_but_the_kept_dir(fake_hosts)


def _no_leftovers_but_the_kept_dir(hosts: FakeHosts) -> None:
    # Provider local: `ray down` stops Ray; the head's files stay (a cloud node goes).
    for host in ("head", "worker"):
        assert hosts.wait_no_ray_processes(host, timeout=60) == [], host
    assert list(hosts.host_path("worker", "/tmp").glob("hydra-ray-*")) == []
