"""This machine's scratch dirs for one sweep (the package staged for upload,
the spec, a pack on its way home). Each is named after the machine and the
process that made it, so that one a killed launcher left behind (kill -9 runs
no cleanup) is removed by the next launch on the same machine, and never one of
a launcher on another machine that shares the temp dir (a TMPDIR on NFS). None
ever holds the only copy of a job's files: the cluster keeps its copy until
they are home."""

import contextlib
import hashlib
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def machine_tag() -> str:
    """This machine, in a dir name: a short hash of its host name (no '-')."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def remove_stale(prefix: str) -> list[Path]:
    """Remove this user's `prefix-<this machine>-<pid>-*` dirs in the temp dir
    whose process is gone; the removed ones."""
    removed = []
    mine_here = f"{prefix}-{machine_tag()}-"
    for path in Path(tempfile.gettempdir()).glob(f"{mine_here}*-*"):
        pid = path.name[len(mine_here) :].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            mine = path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid()
        except OSError:
            continue
        if mine:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A new private dir `prefix-<this machine>-<this pid>-*`, removed on exit;
    the ones that killed processes on this machine left first."""
    remove_stale(prefix)
    with tempfile.TemporaryDirectory(prefix=f"{prefix}-{machine_tag()}-{os.getpid()}-") as tmp:
        yield Path(tmp)
