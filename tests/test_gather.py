"""The gather's steps on a real (one-machine) Ray: each runs as the pinned task
it is on a cluster's node, here on the session's only node. A one-machine Ray
shares the driver's filesystem, so the steps are called one by one, with the
"node's" files and the driver's side in different dirs where it matters."""

import hashlib
import os
import subprocess
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hydra_ray.core.errors import PartCorrupted
from hydra_ray.core.jobs import JobStarted
from hydra_ray.engine.gather import (
    CHUNK_BYTES,
    JobDirs,
    _bring,
    _pack,
    _Packed,
    _Part,
    _pinned,
    _remove,
    extract,
    fetch_to,
)

NO_MARKER = "/nonexistent/.hydra-ray-node-x"


@pytest.fixture
def node_id(ray_session: str) -> str:
    import ray

    return str(ray.get_runtime_context().get_node_id())


def on_node(node_id: str, fn: Callable[..., Any], *args: Any) -> Any:
    import ray

    return ray.get(_pinned(fn)(node_id).remote(*args))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def job_dir(sweep: Path, name: str, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (sweep / name / rel).parent.mkdir(parents=True, exist_ok=True)
        (sweep / name / rel).write_bytes(data)
    return sweep / name


def test_a_large_part_arrives_in_chunks_as_it_was_packed(node_id: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    big = os.urandom(3 * CHUNK_BYTES + 12345)  # four chunks, the last one short
    job_dir(sweep, "0", {"checkpoint.pt": big, ".hydra/config.yaml": b"x: 1\n"})
    packed: _Packed = on_node(node_id, _pack, str(sweep), [str(sweep / "0")], NO_MARKER, "/")
    assert packed.tar is not None and packed.size > len(big)
    try:
        fetched = tmp_path / "fetched.tar"
        with fetched.open("wb") as out:
            fetch_to(out, node_id, packed)
        assert fetched.stat().st_size == packed.size
        assert sha256(fetched) == packed.sha256 == sha256(Path(packed.tar))
        home = tmp_path / "home"
        extract(fetched, home, winning=["0"])
        assert (home / "0" / "checkpoint.pt").read_bytes() == big
        assert (home / "0" / ".hydra" / "config.yaml").read_text() == "x: 1\n"
    finally:
        os.unlink(packed.tar)


def test_a_part_that_arrives_damaged_is_not_removed_on_its_node(
    node_id: str, tmp_path: Path
) -> None:
    import ray

    sweep = tmp_path / "sweep"
    job_dir(sweep, "0", {"out.bin": os.urandom(100_000)})
    packed: _Packed = on_node(node_id, _pack, str(sweep), [str(sweep / "0")], NO_MARKER, "/")
    assert packed.tar is not None
    with open(packed.tar, "r+b") as tar:  # the node's copy goes bad before the fetch
        tar.truncate(packed.size // 2)
    part = _Part(node="10.0.0.9", node_id=node_id, dirs=[str(sweep / "0")], winning=set())
    left = _bring(part, ray.put(packed), sweep, jobs_cwd="/", cwd_is_ours=False)
    assert left is not None
    assert left.node == "10.0.0.9" and left.paths == [str(sweep / "0")]
    assert "PartCorrupted" in left.error
    assert (sweep / "0" / "out.bin").stat().st_size == 100_000  # still there
    assert not os.path.exists(packed.tar)  # only the damaged copy went
    assert [p.name for p in sweep.iterdir()] == ["0"]  # no temp file left behind


def test_a_corrupted_fetch_is_refused(node_id: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    job_dir(sweep, "0", {"out.txt": b"data"})
    packed: _Packed = on_node(node_id, _pack, str(sweep), [str(sweep / "0")], NO_MARKER, "/")
    assert packed.tar is not None
    Path(packed.tar).write_bytes(b"y" * packed.size)  # same size, other bytes
    try:
        with (tmp_path / "fetched.tar").open("wb") as out, pytest.raises(PartCorrupted):
            fetch_to(out, node_id, packed)
    finally:
        os.unlink(packed.tar)


def test_removing_a_part_removes_only_the_job_dirs_it_holds(node_id: str, tmp_path: Path) -> None:
    sweep = tmp_path / "outputs"  # a dir the user had before the sweep
    (sweep / "data").mkdir(parents=True)
    (sweep / "notes.txt").write_text("mine")
    zero = job_dir(sweep, "0", {"a.txt": b"a", "sub/b.txt": b"b"})
    one = job_dir(sweep, "1", {"a.txt": b"a"})
    tar = tmp_path / "part.tar"
    tar.write_bytes(b"")
    not_removed = on_node(node_id, _remove, str(tar), [str(zero)], str(sweep), "/", False)
    assert not_removed == []
    assert not zero.exists() and not tar.exists()
    assert sorted(p.name for p in sweep.iterdir()) == ["1", "data", "notes.txt"]
    assert one.is_dir()


def test_removing_the_last_part_removes_the_empty_dirs_of_the_sweep_and_our_workdir(
    node_id: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "hydra-ray-abc"  # the head driver's temp dir, made on the node
    sweep = workdir / "multirun" / "2026-12-01" / "10-00-00"
    dirs = [str(job_dir(sweep, str(n), {"a.txt": b"a"})) for n in range(2)]
    tar = tmp_path / "part.tar"
    tar.write_bytes(b"")
    assert on_node(node_id, _remove, str(tar), dirs, str(sweep), str(workdir), True) == []
    assert list(tmp_path.iterdir()) == []
    # The user's own working dir stays, even empty.
    sweep = tmp_path / "proj" / "multirun"
    dirs = [str(job_dir(sweep, "0", {"a.txt": b"a"}))]
    tar.write_bytes(b"")
    on_node(node_id, _remove, str(tar), dirs, str(sweep), str(tmp_path / "proj"), False)
    assert [p.name for p in tmp_path.iterdir()] == ["proj"]
    assert list((tmp_path / "proj").iterdir()) == []


def test_a_worker_whose_own_cwd_is_gone_still_removes_a_part(tmp_path: Path) -> None:
    """A Ray worker that ran a job in a dir since gathered has no cwd any more
    (seen on a node whose Ray was restarted mid-sweep): removing the next part
    there still works, instead of failing in os.getcwd()."""
    sweep = tmp_path / "outputs"
    zero = job_dir(sweep, "0", {"a.txt": b"a"})
    gone = tmp_path / "gone"
    gone.mkdir()
    tar = tmp_path / "part.tar"
    tar.write_bytes(b"")
    code = (
        "import os, sys\n"
        "from hydra_ray.engine.gather import _remove\n"
        f"os.chdir({str(gone)!r}); os.rmdir({str(gone)!r})\n"
        f"print(_remove({str(tar)!r}, [{str(zero)!r}], {str(sweep)!r}, '/', False))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    assert not zero.exists() and not tar.exists()


def test_job_dirs_that_are_not_the_sweep_s_own_are_never_packed(
    node_id: str, tmp_path: Path
) -> None:
    project = tmp_path / "project"  # hydra.sweep.dir=. and hydra.sweep.subdir=.
    (project / "src").mkdir(parents=True)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    dirs = [str(project), str(outside)]
    packed: _Packed = on_node(node_id, _pack, str(project), dirs, NO_MARKER, str(project))
    assert packed.tar is None and packed.dirs == []
    assert dict(packed.refused) == {
        str(project): f"it holds {project}, which is never removed",
        str(outside): f"outside the sweep dir {project}",
    }
    assert (project / "src").is_dir() and outside.is_dir()


def test_a_node_that_sees_the_driver_s_files_packs_nothing(node_id: str, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    job_dir(sweep, "0", {"a.txt": b"a"})
    marker = sweep / ".hydra-ray-node-test"
    marker.touch()
    packed = on_node(node_id, _pack, str(sweep), [str(sweep / "0")], str(marker), "/")
    assert packed == _Packed()


def _tar_of(tmp_path: Path, name: str, files: dict[str, bytes]) -> Path:
    src = tmp_path / f"src-{name}"
    job_dir(src, "0", files)
    path = tmp_path / f"{name}.tar"
    with tarfile.open(path, "w") as tar:
        tar.add(src / "0", arcname="0")
    return path


@pytest.mark.parametrize("order", ["failed attempt first", "recorded attempt first"])
def test_the_recorded_attempt_s_files_win_over_another_attempt_s(
    tmp_path: Path, order: str
) -> None:
    failed = _tar_of(tmp_path, "failed", {"ckpt": b"partial", "epoch_5": b"5", "log": b"f"})
    recorded = _tar_of(tmp_path, "recorded", {"ckpt": b"final", "log": b"r"})
    home = tmp_path / "home"
    parts = [(failed, []), (recorded, ["0"])]
    for tar, winning in parts if order == "failed attempt first" else parts[::-1]:
        extract(tar, home, winning=winning)
    assert (home / "0" / "ckpt").read_bytes() == b"final"
    assert (home / "0" / "log").read_bytes() == b"r"
    assert (home / "0" / "epoch_5").read_bytes() == b"5"  # added: nothing was there


def test_a_recorded_attempt_on_the_driver_s_node_is_never_overwritten(tmp_path: Path) -> None:
    failed = _tar_of(tmp_path, "failed", {"ckpt": b"partial"})
    home = tmp_path / "home"
    job_dir(home, "0", {"ckpt": b"final"})
    extract(failed, home, winning=[])
    assert (home / "0" / "ckpt").read_bytes() == b"final"


def test_job_dirs_know_which_node_holds_each_job_s_recorded_attempt() -> None:
    from hydra.core.utils import JobReturn

    from hydra_ray.core.jobs import JobOutcome

    dirs = JobDirs()
    for node in ("a", "b"):
        dirs.job_started(JobStarted(0, 1, f"ip-{node}", 1, node_id=node, job_dir="/s/0"))
    dirs.job_started(JobStarted(1, 1, "ip-a", 1, node_id="a", job_dir="/s/1"))
    dirs.job_started(JobStarted(2, 1, "ip-a", 1, node_id="a", job_dir=None))  # never composed
    dirs.job_finished(
        JobOutcome(0, JobReturn(), 0.0, 1.0, node="ip-b", node_id="b", job_dir="/s/0")
    )
    parts = {p.node_id: p for p in dirs.parts(skip_node=None)}
    assert parts["a"] == _Part("ip-a", "a", ["/s/0", "/s/1"], winning=set())
    assert parts["b"] == _Part("ip-b", "b", ["/s/0"], winning={"/s/0"})
    assert [p.node_id for p in dirs.parts(skip_node="a")] == ["b"]
