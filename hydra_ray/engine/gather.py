"""Bring home what this sweep's jobs wrote on other nodes of a Ray cluster.

Only the job dirs that the sweep's jobs said they write in (`JobStarted`) are
fetched, each from the node it was written on, in steps that never lose a file:

1. a task pinned to the node packs them into a tar file on the node's disk and
   returns its size and sha256;
2. the driver pulls that file in chunks through Ray's object store (a few in
   flight: memory stays small whatever the outputs weigh), writes it to a temp
   file, and checks its size and sha256;
3. the driver extracts it into its sweep dir;
4. only then a second task pinned to the node removes what was packed (and the
   tar file), then the parents left empty, up to the sweep dir.

No step is retried by Ray (a retry must never stand for data it did not bring).
A node whose part fails at any step keeps its files and is named, with its
paths, in what `gather_outputs` returns; the other nodes go on.

Ray is imported inside functions, where it is needed.
"""

import contextlib
import dataclasses
import hashlib
import os
import shutil
import tarfile
import tempfile
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from hydra_ray.core.digest import file_digest
from hydra_ray.core.errors import PartCorrupted, UnsafeArchive
from hydra_ray.core.jobs import JobOutcome, JobStarted
from hydra_ray.core.redact import redacting_logger
from hydra_ray.core.untar import extract_within

log = redacting_logger(__name__)

# Bytes per fetch task, and fetch tasks in flight per node.
CHUNK_BYTES = 16 * 1024 * 1024
_IN_FLIGHT = 4
_TAR_PREFIX = "hydra-ray-gather-"


class JobDirs:
    """Where this sweep's jobs write: every (node, job dir) an attempt of a job
    started on, and the node of each job's recorded attempt (its files win)."""

    def __init__(self) -> None:
        # node id -> (node IP, {job dir: numbers of the jobs that started there})
        self._nodes: dict[str, tuple[str, dict[str, set[int]]]] = {}
        self._recorded: dict[int, str] = {}

    def job_started(self, event: JobStarted) -> None:
        self._add(event.idx, event.node, event.node_id, event.job_dir)

    def job_finished(self, outcome: JobOutcome) -> None:
        self._recorded[outcome.idx] = outcome.node_id
        # A run that Ray itself repeated elsewhere (a crash) announced no new start.
        self._add(outcome.idx, outcome.node, outcome.node_id, outcome.job_dir)

    def _add(self, idx: int, node: str, node_id: str, job_dir: str | None) -> None:
        if node_id and job_dir is not None:
            _, dirs = self._nodes.setdefault(node_id, (node, {}))
            dirs.setdefault(job_dir, set()).add(idx)

    def _recorded_on(self, idxs: set[int], node_id: str) -> bool:
        return any(self._recorded.get(i) == node_id for i in idxs)

    def parts(self, skip_node: str | None) -> list["_Part"]:
        return [
            _Part(
                node=ip,
                node_id=node_id,
                dirs=sorted(dirs),
                winning={d for d, idxs in dirs.items() if self._recorded_on(idxs, node_id)},
            )
            for node_id, (ip, dirs) in self._nodes.items()
            if node_id != skip_node
        ]


@dataclass(frozen=True)
class LeftOnNode:
    """A node's part that did not come home: its files are still on that node."""

    node: str
    node_id: str
    paths: list[str]
    error: str

    def as_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Part:
    """One node's job dirs, and those of them whose job's recorded attempt ran there."""

    node: str
    node_id: str
    dirs: list[str]
    winning: set[str]


@dataclass(frozen=True)
class _Packed:
    """What a node packed: its tar file there (None: nothing to bring)."""

    tar: str | None = None
    size: int = 0
    sha256: str = ""
    dirs: list[str] = field(default_factory=list)
    # Job dirs it must neither bring nor remove, with the reason.
    refused: list[tuple[str, str]] = field(default_factory=list)


# Another way than Ray to the disk of a node whose Ray is gone (the cluster
# launchers' head reaches its nodes over ssh): copy (node IP, job dirs, of them
# those whose files win) into the same paths here, then remove them there.
# Raises OSError when it cannot; nothing is removed there then.
DiskReach = Callable[[str, list[str], set[str]], None]


def gather_outputs(
    sweep_dir: Path,
    job_dirs: JobDirs,
    *,
    jobs_cwd: str,
    cwd_is_ours: bool,
    reach: DiskReach | None = None,
) -> list[LeftOnNode]:
    """Extract into `sweep_dir` (absolute, on this machine) the job dirs the
    sweep's jobs wrote on the cluster's other nodes, and remove them there
    once they are here. Return the parts that stayed on their node. A node
    whose Ray is gone holding files of a job's recorded attempt: through
    `reach`, if given.

    `jobs_cwd` is the jobs' working dir: never removed, unless `cwd_is_ours`
    (the head driver's temp dir) and left empty. Nodes that see this machine's
    files (this machine itself, or a shared filesystem) hold nothing to bring
    and nothing to remove: a marker file written here tells them apart. (With
    Ray Client this machine is no node of the cluster at all.)"""
    import ray

    client = ray.util.client.ray.is_connected()  # type: ignore[no-untyped-call]
    parts = job_dirs.parts(skip_node=None if client else ray.get_runtime_context().get_node_id())
    if not parts:
        return []
    sweep_dir.mkdir(parents=True, exist_ok=True)
    marker = sweep_dir / f".hydra-ray-node-{uuid.uuid4().hex}"
    marker.touch()
    try:
        pack = _pinned(_pack)
        packs = [
            (part, pack(part.node_id).remote(str(sweep_dir), part.dirs, str(marker), jobs_cwd))
            for part in parts
        ]
        # A node whose Ray was restarted comes back as another node on the same
        # disk: the dirs the live one holds are its to bring, not the dead one's.
        live: dict[str, set[str]] = {}
        for part in parts:
            if _alive(part.node_id):
                live.setdefault(part.node, set()).update(part.dirs)
        left = []
        for part, packed in packs:
            problem = _bring(part, packed, sweep_dir, jobs_cwd, cwd_is_ours)
            if problem is not None and not part.winning and not _alive(part.node_id):
                # Only attempts that ran again elsewhere wrote there: their jobs'
                # recorded attempts' files came from where those ran.
                log.warning(
                    f"Node {part.node} is gone ({problem.error}); it held only files of "
                    f"attempts whose jobs ran again on other nodes ({', '.join(problem.paths)}): "
                    "the recorded attempts' files came from there, nothing of them is lost"
                )
                continue
            if problem is not None and reach is not None and not _alive(part.node_id):
                taken = live.get(part.node, set())
                dirs = [d for d in part.dirs if d not in taken]
                try:
                    reach(part.node, dirs, part.winning - taken)
                except OSError as exc:
                    problem = dataclasses.replace(
                        problem, error=f"{problem.error}; and not over ssh: {exc}"
                    )
                else:
                    log.warning(
                        f"Node {part.node}'s Ray is gone ({problem.error}); its disk was not: "
                        f"gathered its job dirs over ssh ({', '.join(dirs) or 'none left'})"
                    )
                    continue
            if problem is not None:
                left.append(problem)
                log.error(
                    f"The outputs written on node {part.node} did not come home ({problem.error}); "
                    f"they are still there, in {', '.join(problem.paths)}: copy them from that "
                    f"node before it goes"
                )
        return left
    finally:
        marker.unlink(missing_ok=True)


def _alive(node_id: str) -> bool:
    """Whether Ray counts the node alive (a node whose Ray died is not)."""
    import ray

    return any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes())  # type: ignore[no-untyped-call]


def _pinned(fn: Callable[..., Any]) -> Callable[[str], Any]:
    """`fn` as a Ray task that runs on the given node or fails, never retried."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(fn)

    def on(node_id: str) -> Any:
        return task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False))

    return on


def _bring(
    part: _Part, packed_ref: Any, sweep_dir: Path, jobs_cwd: str, cwd_is_ours: bool
) -> LeftOnNode | None:
    """Steps 2 to 4 for one node; what stayed there, if anything did."""
    import ray

    packed: _Packed | None = None
    try:
        packed = ray.get(packed_ref)
        assert isinstance(packed, _Packed)
        if packed.tar is not None:
            fd, local = tempfile.mkstemp(dir=sweep_dir, prefix=f".{_TAR_PREFIX}", suffix=".tar")
            try:
                with os.fdopen(fd, "wb") as f:
                    fetch_to(f, part.node_id, packed)
                winning = {os.path.relpath(d, sweep_dir) for d in part.winning}
                extract(Path(local), sweep_dir, winning=winning)
            finally:
                os.unlink(local)
            log.info(
                f"Gathered the outputs written on node {part.node} ({len(packed.dirs)} job dirs, "
                f"{packed.size / 1e6:.1f} MB) into {sweep_dir}"
            )
    except (
        ray.exceptions.RayError,
        OSError,
        tarfile.TarError,
        PartCorrupted,
        UnsafeArchive,
    ) as exc:
        if packed is not None and packed.tar is not None:
            _discard(part, packed.tar)
        return LeftOnNode(part.node, part.node_id, part.dirs, f"{type(exc).__name__}: {exc}")
    if packed.tar is not None:
        remove = _pinned(_remove)(part.node_id)
        try:
            not_removed = ray.get(
                remove.remote(packed.tar, packed.dirs, str(sweep_dir), jobs_cwd, cwd_is_ours)
            )
        except ray.exceptions.RayError as exc:
            not_removed = [f"{type(exc).__name__}: {exc}"]
        if not_removed:  # here already: a copy left there loses nothing
            log.warning(f"Could not remove on node {part.node}: {'; '.join(not_removed)}")
    if packed.refused:
        refused = "; ".join(f"{path} ({why})" for path, why in packed.refused)
        return LeftOnNode(
            part.node, part.node_id, [p for p, _ in packed.refused], f"not gathered: {refused}"
        )
    return None


def fetch_to(out: BinaryIO, node_id: str, packed: _Packed) -> None:
    """Write the node's tar file to `out` chunk by chunk, and check that what
    came is what was packed: raises PartCorrupted if it is not (size or sha256)."""
    import ray

    assert packed.tar is not None
    read = _pinned(read_chunk)(node_id)
    offsets = iter(range(0, packed.size, CHUNK_BYTES))
    pending: deque[Any] = deque()

    def ask() -> None:
        offset = next(offsets, None)
        if offset is not None:
            pending.append(read.remote(packed.tar, offset, CHUNK_BYTES))

    for _ in range(_IN_FLIGHT):
        ask()
    digest, got = hashlib.sha256(), 0
    while pending:
        data = ray.get(pending.popleft())
        ask()
        out.write(data)
        digest.update(data)
        got += len(data)
    if got != packed.size or digest.hexdigest() != packed.sha256:
        raise PartCorrupted(
            f"{packed.tar} arrived as {got} bytes with sha256 {digest.hexdigest()}, "
            f"packed as {packed.size} bytes with sha256 {packed.sha256}"
        )


def extract(tar_file: Path, sweep_dir: Path, *, winning: Iterable[str]) -> None:
    """Extract a node's part into `sweep_dir`. Files of job dirs in `winning`
    (paths relative to the sweep dir: the recorded attempt ran on that node)
    replace what is here; the others' files (attempts whose result was not
    recorded) are added only where nothing is yet."""
    wins = {os.path.normpath(w) for w in winning}

    def keep(member: tarfile.TarInfo) -> bool:
        return _job_dir_of(member.name, wins) or not os.path.lexists(sweep_dir / member.name)

    with tarfile.open(tar_file) as tar:
        extract_within(tar, sweep_dir, keep=keep, source=f"a node's part {tar_file.name}")


def _job_dir_of(name: str, dirs: set[str]) -> bool:
    """Whether archive member `name` lies in one of `dirs`."""
    path = os.path.normpath(name)
    return "." in dirs or any(path == d or path.startswith(d + os.sep) for d in dirs)


# ---- On the node ----


def _protected(jobs_cwd: str) -> list[str]:
    """Dirs of the node that no gather removes, nor any dir that holds them.

    A Ray worker's own cwd is one of them while it exists: a worker whose cwd
    was a job dir that is gone (already gathered) protects nothing there.
    """
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        return [os.sep, os.path.expanduser("~"), jobs_cwd]
    return [os.sep, os.path.expanduser("~"), cwd, jobs_cwd]


def _refusal(job_dir: str, sweep_dir: str, protected: list[str]) -> str | None:
    """Why `job_dir` must not be packed and removed on this node, if it must not."""
    job_dir = os.path.normpath(job_dir)
    if os.path.commonpath([job_dir, sweep_dir]) != sweep_dir:
        return f"outside the sweep dir {sweep_dir}"
    for keep in protected:
        keep = os.path.normpath(keep)
        if os.path.commonpath([job_dir, keep]) == job_dir:
            return f"it holds {keep}, which is never removed"
    return None


def _pack(sweep_dir: str, job_dirs: list[str], marker: str, jobs_cwd: str) -> _Packed:
    """Step 1, on the node: its job dirs in a tar file on its disk. Nothing where
    the marker shows the driver's own filesystem."""
    if os.path.exists(marker):
        return _Packed()
    protected = _protected(jobs_cwd)
    dirs, refused = [], []
    for job_dir in job_dirs:
        why = _refusal(job_dir, sweep_dir, protected)
        if why is not None:
            refused.append((job_dir, why))
        elif os.path.isdir(job_dir):
            dirs.append(job_dir)
    if not dirs:
        return _Packed(refused=refused)
    fd, tar_path = tempfile.mkstemp(prefix=_TAR_PREFIX, suffix=".tar")
    try:
        with os.fdopen(fd, "wb") as f, tarfile.open(fileobj=f, mode="w") as tar:
            for job_dir in dirs:
                tar.add(job_dir, arcname=os.path.relpath(job_dir, sweep_dir))
        size, sha256 = file_digest(tar_path)
    except BaseException:
        os.unlink(tar_path)
        raise
    return _Packed(tar_path, size, sha256, dirs, refused)


def read_chunk(path: str, offset: int, length: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(length)


def _remove(
    tar: str, job_dirs: list[str], sweep_dir: str, jobs_cwd: str, cwd_is_ours: bool
) -> list[str]:
    """Step 4, on the node: remove the tar file and exactly the job dirs it
    holds, then their parents left empty up to the sweep dir (and up to the
    jobs' working dir if it is ours); what could not be removed, and why."""
    failed = []
    removals: list[tuple[str, Callable[[str], None]]] = [(tar, os.unlink)]
    for path, remove in removals + [(d, shutil.rmtree) for d in job_dirs]:
        try:
            remove(path)
        except OSError as exc:
            failed.append(f"{path}: {exc}")
    ours = os.path.normpath(jobs_cwd) if cwd_is_ours else None
    top = sweep_dir
    if ours is not None and os.path.commonpath([sweep_dir, ours]) == ours:
        top = ours
    keep = {os.path.normpath(p) for p in _protected(jobs_cwd)} - {ours}
    for job_dir in job_dirs:
        parent = os.path.dirname(job_dir)
        while os.path.commonpath([parent, top]) == top and parent not in keep:
            try:
                os.rmdir(parent)
            except OSError:  # not empty (someone else's files), or gone already
                if os.path.isdir(parent):
                    break
            parent = os.path.dirname(parent)
    if ours is not None and top != ours:
        with contextlib.suppress(OSError):  # not empty: something else lives there
            os.rmdir(ours)
    return failed


def _unlink(path: str) -> None:
    os.unlink(path)


def _discard(part: _Part, tar: str) -> None:
    """After a failed step: only the tar file goes (the job dirs stay)."""
    import ray

    try:
        ray.get(_pinned(_unlink)(part.node_id).remote(tar))
    except ray.exceptions.RayError as exc:
        log.warning(f"Could not remove {tar} on node {part.node}: {exc}")
