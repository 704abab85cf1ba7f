"""The stop of what an interrupted ray.init() started: the whole tree of new
processes, grandchildren included, and nothing that was there before."""

import subprocess
import sys
import time

import pytest

from hydra_ray.infra.procs import descendants, kill_new_descendants

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_new_children_and_grandchildren_are_killed_and_earlier_ones_kept() -> None:
    earlier = subprocess.Popen(["sleep", "60"])
    try:
        before = descendants()
        assert earlier.pid in before
        # A child that starts a grandchild, as the raylet starts Ray's agents.
        new = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE)
        assert new.stdout is not None
        grandchild = int(new.stdout.readline())
        killed = kill_new_descendants(before)
        assert {new.pid, grandchild} <= killed and earlier.pid not in killed
        deadline = time.monotonic() + 5
        while _alive(grandchild) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(grandchild) and not _alive(new.pid)
        assert _alive(earlier.pid)
    finally:
        earlier.kill()
        earlier.wait()
