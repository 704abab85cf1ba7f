"""rsync and ssh command lines for syncing between this machine and a cluster's
head (`sync_up`, `sync_down`), with rsync's include/exclude semantics.

Plain functions that build argv lists; nothing here runs them or imports Ray.
"""

import getpass
import hashlib
import os
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

_WILDCARDS = frozenset("*?[")


def rsync_command(
    source: str,
    target: str,
    *,
    include: Sequence[str],
    exclude: Sequence[str],
    ssh: Sequence[str] | None,
) -> list[str]:
    """The argv of an rsync that copies the contents of the directory `source`
    into the directory `target` (`-a`: recursive, keeping times and modes).

    Patterns are rsync's: every include comes before every exclude and, per
    path, the first pattern that matches decides. So that what users write
    does what they mean, each include is widened:

    - a name without wildcards also brings everything below it: `model`
      adds `model/**`, so include ['model', '*.py'] with exclude ['*'] copies
      the whole model package and the top-level .py files (rsync alone would
      stop at the `model` entry and drop model/'s other files);
    - a path with directories also includes those directories: `src/model`
      adds `src/`, or rsync would exclude `src` and never look inside.

    With any pattern, `--prune-empty-dirs` leaves out directories that end up
    empty: include ['*.pt', '*/'] with exclude ['*'] brings every .pt file at
    any depth with just the directories that lead to one. Without patterns,
    everything is copied, empty directories too.

    `source` gets a trailing `/` if it has none (rsync then copies its
    contents, not the directory itself). `ssh` is the remote shell's argv (see
    `ssh_command`) for a `user@host:path` source or target; None copies locally.
    """
    argv = ["rsync", "-a"]
    if ssh is not None:
        argv += ["-z", "-e", shlex.join(ssh)]
    if include or exclude:
        argv.append("--prune-empty-dirs")
    argv += [f"--include={p}" for pattern in include for p in _widened_include(pattern)]
    argv += [f"--exclude={pattern}" for pattern in exclude]
    argv += [source if source.endswith("/") else f"{source}/", target]
    return argv


def _widened_include(pattern: str) -> list[str]:
    """`pattern`, the directories leading to it, and everything below a plain name."""
    anchor = "/" if pattern.startswith("/") else ""
    parts = [p for p in pattern.strip("/").split("/") if p]
    if not parts:
        return [pattern]
    parents = [anchor + "/".join(parts[:i]) + "/" for i in range(1, len(parts))]
    below = []
    if not _WILDCARDS & set(parts[-1]):
        below = [anchor + "/".join(parts) + "/**"]
    return [*parents, pattern, *below]


def ssh_command(
    auth: Mapping[str, Any], *, cluster_name: str | None = None, timeout: int = 120
) -> list[str]:
    """The ssh argv (without the destination) that reaches the cluster's nodes as
    Ray's cluster launcher does, from the cluster config's `auth` section:
    `ssh_private_key` (`-i`) and `ssh_proxy_command`, with the options of Ray's
    SSHCommandRunner (no host key checks or known_hosts entries: cloud nodes
    change keys; keep-alives; `timeout` seconds to connect).

    With `cluster_name`, ssh shares Ray's connection to the node (Ray's
    ControlPath for that cluster, created if missing), so no second login is made.
    """
    argv = ["ssh"]
    key = auth.get("ssh_private_key")
    if key:
        argv += ["-i", os.path.expanduser(str(key))]
    options: dict[str, str] = {
        "StrictHostKeyChecking": "no",
        "UserKnownHostsFile": os.devnull,
        "IdentitiesOnly": "yes",
        "ExitOnForwardFailure": "yes",
        "ServerAliveInterval": "5",
        "ServerAliveCountMax": "3",
    }
    if cluster_name is not None:
        control_dir = ray_ssh_control_dir(cluster_name)
        os.makedirs(control_dir, mode=0o700, exist_ok=True)
        options.update(ControlMaster="auto", ControlPath=f"{control_dir}/%C", ControlPersist="10s")
    proxy = auth.get("ssh_proxy_command")
    if proxy:
        options["ProxyCommand"] = str(proxy)
    options["ConnectTimeout"] = f"{timeout}s"
    for name, value in options.items():
        argv += ["-o", f"{name}={value}"]
    return argv


def ray_ssh_control_dir(cluster_name: str) -> str:
    """The directory of Ray's ssh ControlMaster sockets for a cluster (as in
    ray.autoscaler._private.command_runner.SSHCommandRunner)."""
    user_hash = hashlib.sha256(getpass.getuser().encode()).hexdigest()[:10]
    cluster_hash = hashlib.sha256(cluster_name.encode()).hexdigest()[:10]
    return f"/tmp/ray_ssh_{user_hash}/{cluster_hash}"


def remote_path(user: str, host: str, path: str) -> str:
    """`user@host:path`, rsync's name for `path` on a node (IPv6 hosts bracketed)."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{user}@{host}:{path}"
