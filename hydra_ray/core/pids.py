"""Pid files that a reused pid cannot fool: each holds the process's pid and its
start time (field 22 of /proc/PID/stat, clock ticks since boot), and a process
counts as the one named only while both match. A pid alone, once its process
has ended, may name any later process: a watchdog that read it as "the driver
still runs" would never tear its cluster down.

The shell snippets run on a cluster's head (Linux: it has /proc); the Python
functions on whichever machine writes or reads such a file. A file without a
start time (a launcher before this one) never counts as running.
"""

import os
from pathlib import Path


def _start_in_shell(pid: str) -> str:
    # After "PID (COMM) " (COMM may hold spaces and parentheses), the state is
    # field 1 and the start time field 20.
    return f"$(sed 's/.*) //' /proc/{pid}/stat 2>/dev/null | cut -d' ' -f20)"


def write_own_pid(path: str) -> str:
    """Shell: write the running shell's pid file at `path` (a shell word), whole."""
    return f'echo "$$ {_start_in_shell("$$")}" > {path}.new && mv -f {path}.new {path}'


def still_runs(path: str) -> str:
    """Shell test: the process the pid file at `path` (a shell word) names runs."""
    return (
        f'{{ read -r _pid _start < {path} && [ -n "$_start" ] && '
        f'[ "{_start_in_shell("$_pid")}" = "$_start" ]; }} 2>/dev/null'
    )


def pid_in(path: str) -> str:
    """Shell: the pid the pid file at `path` (a shell word) holds."""
    return f"$(cut -d' ' -f1 {path})"


def start_time(pid: int) -> str | None:
    """The process's start time, or None if it does not run (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(") ")[2].split()[19]


def own_pid_line() -> str:
    """This process's pid and start time, as a pid file holds them."""
    return f"{os.getpid()} {start_time(os.getpid()) or ''}".rstrip()


def runs(pid: int, start: str | None) -> bool:
    """Whether the process `pid` that started at `start` still runs (a process
    whose start time is unknown counts as gone: its pid may be another's)."""
    return start is not None and start_time(pid) == start
