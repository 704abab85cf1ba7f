"""Scratch dirs a killed launcher left behind are removed by the next launch,
and only those: not a live process's, not another user's."""

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydra_ray.infra.scratch import machine_tag, remove_stale, scratch_dir

HERE = machine_tag()


@pytest.fixture
def temp_dir(tmp_path: Path) -> Iterator[Path]:
    old = tempfile.tempdir
    tempfile.tempdir = str(tmp_path)
    try:
        yield tmp_path
    finally:
        tempfile.tempdir = old


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_dead_launcher_s_dir_goes_a_live_one_s_stays(temp_dir: Path) -> None:
    dead = temp_dir / f"hydra-ray-jobs-{HERE}-{_dead_pid()}-abc"
    (dead / "package").mkdir(parents=True)
    (dead / "package" / "spec.pkl").write_bytes(b"x")
    live = temp_dir / f"hydra-ray-jobs-{HERE}-{os.getppid()}-def"
    live.mkdir()
    other_kind = temp_dir / f"hydra-ray-cluster-{HERE}-{_dead_pid()}-ghi"
    other_kind.mkdir()
    no_pid = temp_dir / "hydra-ray-jobs-1pgiffrv"
    no_pid.mkdir()
    with scratch_dir("hydra-ray-jobs") as mine:
        assert mine.is_dir() and mine.name.startswith(f"hydra-ray-jobs-{HERE}-{os.getpid()}-")
        assert not dead.exists()
        assert live.is_dir() and other_kind.is_dir() and no_pid.is_dir()
        # This process's own dir is never stale to itself.
        assert remove_stale("hydra-ray-jobs") == [] and mine.is_dir()
    assert not mine.exists()


def test_a_file_or_a_link_by_that_name_is_left_alone(temp_dir: Path) -> None:
    pid = _dead_pid()
    target = temp_dir / "elsewhere"
    target.mkdir()
    (temp_dir / f"hydra-ray-jobs-{HERE}-{pid}-link").symlink_to(target)
    (temp_dir / f"hydra-ray-jobs-{HERE}-{pid}-file").write_text("")
    assert remove_stale("hydra-ray-jobs") == []
    assert target.is_dir() and (temp_dir / f"hydra-ray-jobs-{HERE}-{pid}-file").is_file()


def test_a_launcher_s_dir_of_another_machine_sharing_the_temp_dir_stays(temp_dir: Path) -> None:
    """A TMPDIR on NFS: the other machine's launcher has a pid no process has
    here; its dir is its own, not stale."""
    other = temp_dir / f"hydra-ray-jobs-0badc0de-{_dead_pid()}-abc"
    other.mkdir()
    assert remove_stale("hydra-ray-jobs") == []
    assert other.is_dir()
