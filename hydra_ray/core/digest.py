"""The size and sha256 of a file: how every copy of outputs that crosses a
network (a node's part, the Ray job's pack) is checked on arrival."""

import hashlib
from pathlib import Path

CHUNK_BYTES = 1 << 20


def file_digest(path: str | Path) -> tuple[int, str]:
    """(size in bytes, sha256 hex digest) of the file at `path`, read in chunks."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while data := f.read(CHUNK_BYTES):
            digest.update(data)
            size += len(data)
    return size, digest.hexdigest()
