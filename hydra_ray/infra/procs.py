"""Stopping the processes an interrupted `ray.init()` had started.

A Ctrl-C inside ray.init() comes before Ray records the node it is starting, so
ray.shutdown() cannot stop it; Ray's agents then outlive their raylet by a
minute or more. What this process started meanwhile is stopped here: frozen
first (SIGSTOP), so that none forks or is orphaned (and so lost from the tree)
while the tree is read, then killed. Linux only (it reads /proc); elsewhere
nothing is done and Ray's own exit hooks stay the only cleanup.
"""

import contextlib
import os
import signal
from pathlib import Path

_PROC = Path("/proc")


def descendants(pid: int | None = None) -> set[int]:
    """The PIDs of every live descendant of `pid` (this process by default)."""
    root = os.getpid() if pid is None else pid
    children: dict[int, list[int]] = {}
    if not _PROC.is_dir():
        return set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def kill_new_descendants(before: set[int]) -> set[int]:
    """SIGKILL every descendant of this process not in `before`; returns their PIDs."""
    frozen: set[int] = set()
    while True:  # until the frozen tree stops growing: stopped processes cannot fork
        new = descendants() - before - frozen
        if not new:
            break
        for pid in new:
            _signal(pid, signal.SIGSTOP)
        frozen |= new
    for pid in frozen:
        _signal(pid, signal.SIGKILL)
    for pid in frozen:  # this process's own children: reaped, not left as zombies
        # (ChildProcessError: not a child of this process, or reaped already)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)  # SIGKILL ends even a stopped process at once
    return frozen


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)
