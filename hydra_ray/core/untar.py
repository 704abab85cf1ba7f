"""Extracting an archive that came from a cluster or a storage: nothing lands
outside the target dir, on every Python (those without tarfile's extraction
filters too, 3.10 before 3.10.12 and 3.11 before 3.11.4).

A member whose path leads out of the target (absolute, through `..`), a hard
link to outside it, or a device or FIFO refuses the whole archive: our own
packing never makes one. A symbolic link that leads out of the target (a job's
link to a dataset on its node, say) is left out and named; links inside it are
extracted as the jobs wrote them. No Ray.
"""

import os
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra_ray.core.errors import UnsafeArchive
from hydra_ray.core.redact import redacting_logger

log = redacting_logger(__name__)

# Our check stands instead of tarfile's filters: members as they are (3.14 would
# filter them by default; 3.12 and 3.13 warn when no filter is named).
_AS_CHECKED: dict[str, Any] = (
    {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
)


def extract_within(
    tar: tarfile.TarFile,
    target: Path,
    *,
    keep: Callable[[tarfile.TarInfo], bool] = lambda member: True,
    source: str,
) -> None:
    """Extract the members of `tar` that `keep` selects into `target`, checked
    as this module's docstring says. `source` names where the archive came from,
    in the error. Raises UnsafeArchive, with nothing extracted."""
    root = os.path.realpath(target)
    members, left_out = [], []
    for member in tar.getmembers():
        where = _inside(root, os.path.join(root, member.name))
        if where is None or not (
            member.isfile() or member.isdir() or member.issym() or member.islnk()
        ):
            raise UnsafeArchive(
                f"The archive from {source} has a member that would land outside {target} "
                f"or is no file, dir or link ({member.name!r}): nothing of it was extracted"
            )
        if member.islnk() and _inside(root, os.path.join(root, member.linkname)) is None:
            raise UnsafeArchive(
                f"The archive from {source} has a hard link to outside {target} "
                f"({member.name!r} -> {member.linkname!r}): nothing of it was extracted"
            )
        if (
            member.issym()
            and _inside(root, os.path.join(os.path.dirname(where), member.linkname)) is None
        ):
            left_out.append(f"{member.name} -> {member.linkname}")
            continue
        if keep(member):
            members.append(member)
    if left_out:
        log.warning(f"Links that lead out of {target} were not extracted: {', '.join(left_out)}")
    target.mkdir(parents=True, exist_ok=True)
    tar.extractall(target, members=members, **_AS_CHECKED)


def _inside(root: str, path: str) -> str | None:
    """`path` normalized if it lies in `root` (or is it), else None."""
    normal = os.path.normpath(path)
    return normal if normal == root or normal.startswith(root + os.sep) else None
