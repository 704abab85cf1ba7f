"""The head's autodown watchdog (hydra_ray.infra.autodown), run here by a real
shell as on a head: what counts as idle, its deadline, and disarming it. Its
teardown command is replaced by one that leaves a mark (Ray's teardown from a
real head is tested on the fake hosts, tests/cluster)."""

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hydra_ray.core.pids import start_time
from hydra_ray.infra.autodown import WATCH_DIR, Autodown


class Head:
    """A home dir and a temp root standing in for a head's."""

    def __init__(self, tmp_path: Path) -> None:
        self.home = tmp_path / "home"
        self.tmp_root = tmp_path / "tmp"
        self.home.mkdir()
        self.tmp_root.mkdir()
        self.watch = self.home / WATCH_DIR / "c1"
        self.downed = tmp_path / "downed"

    def run(self, command: str) -> None:
        env = {**os.environ, "HOME": str(self.home)}
        subprocess.run(["sh", "-c", command], env=env, check=True, timeout=30)

    def arm(self, minutes: float) -> Autodown:
        autodown = Autodown("c1", minutes, tmp_root=str(self.tmp_root))
        self.run(autodown.start_command())
        # The teardown is read when the deadline is met: a mark instead of Ray's;
        # and this machine stands for a head whose Ray runs.
        (self.watch / "down").write_text(f"touch {self.downed}\n")
        (self.watch / "alive").write_text("true\n")
        return autodown

    def watchdog_pid(self) -> int:
        deadline = time.monotonic() + 10
        while not (self.watch / "pid").is_file():
            assert time.monotonic() < deadline, "the watchdog did not start"
            time.sleep(0.05)
        return int((self.watch / "pid").read_text().split()[0])

    def wait_down(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not self.downed.exists():
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    def log(self) -> str:
        return (self.watch / "log").read_text()


@pytest.fixture
def head(tmp_path: Path) -> Iterator[Head]:
    head = Head(tmp_path)
    yield head
    pid = head.watch / "pid"
    if pid.is_file():  # a test that failed before its watchdog ended
        subprocess.run(["kill", pid.read_text().split()[0]], check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_an_idle_cluster_is_torn_down_after_its_deadline_and_the_log_says_why(
    head: Head,
) -> None:
    head.arm(minutes=2 / 60)
    pid = head.watchdog_pid()
    assert head.wait_down(timeout=30)
    # Not before its deadline: the idle time it measured (from the arming) is the log's.
    idle = re.search(r"idle for (\d+) s \(hydra.launcher.autodown_minutes\)", head.log())
    assert idle is not None and int(idle.group(1)) >= 2, head.log()
    assert "tearing the cluster down" in head.log()
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the watchdog did not end after its teardown"
        time.sleep(0.1)
    assert "teardown ended with status 0" in head.log()


def test_a_running_driver_keeps_the_cluster_and_its_end_starts_the_clock(head: Head) -> None:
    launch = head.tmp_root / "hydra-ray-abcd1234"
    launch.mkdir()
    driver = subprocess.Popen(["sleep", "6"])
    try:
        (launch / "driver_wrapper.pid").write_text(f"{driver.pid} {start_time(driver.pid)}\n")
        head.arm(minutes=4 / 60)
        assert not head.wait_down(timeout=5), "torn down while a driver ran"
        driver.wait()
        (launch / "driver.rc").write_text("0\n")
        ended = time.monotonic()
        assert head.wait_down(timeout=15)
        # Counted from the driver's end (as seen at the last look, 1 s apart),
        # not from the arming.
        assert time.monotonic() - ended >= 2
    finally:
        driver.kill()


def test_a_driver_s_pid_reused_by_another_process_keeps_nothing(head: Head) -> None:
    """The driver ended without its status (killed) and its pid now names
    another process (here: a live one, started at another time): not a driver
    that runs, so the cluster is torn down at its deadline all the same."""
    launch = head.tmp_root / "hydra-ray-abcd1234"
    launch.mkdir()
    other = subprocess.Popen(["sleep", "60"])
    try:
        started = start_time(other.pid)
        assert started is not None
        (launch / "driver_wrapper.pid").write_text(f"{other.pid} {int(started) - 100}\n")
        head.arm(minutes=2 / 60)
        assert head.wait_down(timeout=20), head.log()
        assert other.poll() is None  # nothing was done to the process of that pid
    finally:
        other.kill()


def test_disarming_leaves_a_process_that_reused_the_watchdog_s_pid_alone(head: Head) -> None:
    autodown = head.arm(minutes=10)
    pid = head.watchdog_pid()
    head.run(f"kill {pid}")
    while _alive(pid):
        time.sleep(0.05)
    other = subprocess.Popen(["sleep", "60"])
    try:
        (head.watch / "pid").write_text(f"{other.pid} 1\n")  # as if it had the pid now
        head.run(autodown.stop_command())
        time.sleep(0.2)
        assert other.poll() is None, "disarming killed a process that was not the watchdog"
        assert not head.watch.exists()
    finally:
        other.kill()


def test_a_transfer_keeps_the_cluster(head: Head) -> None:
    """An rsync on the head (the launcher's bring-home, or a user's `ray
    rsync-down`) is activity: the clock starts again when it ends."""
    # A process named `rsync`, as the `rsync --server` that sshd starts is.
    transfer = subprocess.Popen(["rsync", "6"], executable="sleep")
    try:
        head.arm(minutes=2 / 60)
        assert not head.wait_down(timeout=5), "torn down while a transfer ran"
        transfer.wait()
        assert head.wait_down(timeout=15)
    finally:
        transfer.kill()


def test_results_all_in_the_storage_end_the_wait_and_their_dirs_go_first(head: Head) -> None:
    """A launch's dir whose results are also in sync_down.storage (stored.json)
    need not wait for the deadline; one whose results are only here does."""
    stored = head.tmp_root / "hydra-ray-stored01"
    waiting = head.tmp_root / "hydra-ray-waiting1"
    for launch in (stored, waiting):
        launch.mkdir()
        (launch / "driver.rc").write_text("0\n")
    (stored / "stored.json").write_text("{}")
    head.arm(minutes=1)
    (head.watch / "grace").write_text("2\n")
    (head.watch / "poll").write_text("0.5\n")
    assert not head.wait_down(timeout=8), "torn down while results wait only here"
    shutil.rmtree(waiting)  # as the launcher does once they are home
    assert head.wait_down(timeout=10)
    assert not stored.exists()
    assert f"removed {stored}/: its results are in the storage" in head.log()


def test_arming_again_keeps_one_watchdog_and_takes_the_new_deadline(head: Head) -> None:
    head.arm(minutes=1)  # it looks every 6 s
    pid = head.watchdog_pid()
    head.arm(minutes=2 / 60)
    assert head.watchdog_pid() == pid
    assert (head.watch / "limit").read_text().strip() == "2"
    assert head.wait_down(timeout=15)


def test_a_watchdog_whose_ray_was_stopped_by_someone_else_ends_without_a_teardown(
    head: Head,
) -> None:
    """The user ran the printed `ray down` (or `ray stop` on the head): the
    watchdog has nothing left to watch, and ends within two looks, tearing
    nothing down; its log says why."""
    head.arm(0.5)
    pid = head.watchdog_pid()
    (head.watch / "alive").write_text("false\n")
    deadline = time.monotonic() + 15
    while _alive(pid):
        assert time.monotonic() < deadline, head.log()
        time.sleep(0.2)
    assert "Ray no longer runs on the head" in head.log()
    assert not head.downed.exists()
    assert not (head.watch / "pid").exists()


def test_the_alive_check_finds_a_gcs_and_not_itself(tmp_path: Path) -> None:
    """RAY_ALIVE, as the watchdog runs it: false where no GCS runs (a PID
    namespace of its own, as a head whose Ray is gone), and not fooled by its
    own command line, which names the GCS."""
    from hydra_ray.infra.autodown import RAY_ALIVE

    if os.geteuid() != 0:
        pytest.skip("a PID namespace of its own needs root here, as the fake hosts do")
    alone = ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", RAY_ALIVE]
    assert subprocess.run(alone, timeout=30).returncode == 1
    fake_gcs = tmp_path / "gcs_server"
    fake_gcs.symlink_to("/bin/sleep")
    script = f"{fake_gcs} 30 & {RAY_ALIVE}; rc=$?; kill $!; exit $rc"
    beside = ["unshare", "--pid", "--mount", "--fork", "--mount-proc", "sh", "-c", script]
    assert subprocess.run(beside, timeout=30).returncode == 0


def test_a_disarmed_watchdog_ends_and_leaves_nothing(head: Head) -> None:
    autodown = head.arm(minutes=2 / 60)
    pid = head.watchdog_pid()
    head.run(autodown.stop_command())
    assert not head.watch.exists()
    deadline = time.monotonic() + 10
    while _alive(pid):
        assert time.monotonic() < deadline, "the watchdog still runs"
        time.sleep(0.1)
    assert not head.wait_down(timeout=4)


def test_the_teardown_is_ray_s_own_as_teardown_cluster_says() -> None:
    assert Autodown("c", 60).teardown_command() == (
        "ray stop; ray down -y ~/ray_bootstrap_config.yaml"
    )
    assert Autodown("c", 60, workers_only=True, keep_min_workers=True).teardown_command() == (
        "ray down -y --workers-only --keep-min-workers ~/ray_bootstrap_config.yaml"
    )
