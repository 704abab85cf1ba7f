"""What the launching machine unpickles or untars, it first authenticates as
its own sweep's: every record, returns file and pack that a driver writes
carries an HMAC-SHA256 made with the sweep's key, checked here before anything
of it is read.

The sweep's key is derived from a secret of this machine's user
(`machine_key_path()`, under the XDG state dir, 0600, made on first use) and
the sweep's id (a random name in the sweep's record dir, made when the sweep
starts): a resume derives the same key, another sweep another one. The key
itself is never written into the sweep dir (what a cluster sends home lands
there); it reaches a cluster's head only inside the 0600 job spec, and no job.
A writer of the cluster's disk or of a storage can make a file that does not
verify, never one that does.
Imports nothing of Ray.
"""

import hashlib
import hmac
import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# In the sweep's record dir: the sweep's id.
SWEEP_ID = "sweep_id"
_MAGIC = b"HRS1"
_MAC_BYTES = hashlib.sha256().digest_size


def machine_key_path() -> Path:
    """This user's secret: $XDG_STATE_HOME/hydra-ray/key (~/.local/state by default)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state")
    return Path(state) / "hydra-ray" / "key"


def _machine_key() -> bytes:
    path = machine_key_path()
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # Written whole under another name, then linked in: two launchers that
        # make it at once both read the one that won.
        tmp = path.with_name(f".key.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(secrets.token_bytes(32))
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    key = path.read_bytes()
    if len(key) < 32:
        raise ValueError(
            f"{path} holds {len(key)} bytes, not this machine's 32-byte key for sweeps: "
            "remove it (a new one is made; sweeps begun with the old one cannot resume)"
        )
    return key


def sweep_key(record_dir: Path, *, new: bool, write: bool = True) -> bytes:
    """The key of the sweep whose record dir is `record_dir`: of a `new` sweep
    (its id made, replacing any), else of the one there (its id made if it has
    none: records from before carry no seal and do not verify). Not `write`
    (a dry run): an id is made for the key but not written."""
    path = record_dir / SWEEP_ID
    sweep_id = "" if new else _read_id(path)
    if not sweep_id:
        sweep_id = secrets.token_hex(16)
        if write:
            record_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{SWEEP_ID}.{os.getpid()}")
            tmp.write_text(sweep_id + "\n")
            os.replace(tmp, path)
    return hmac.new(_machine_key(), f"sweep {sweep_id}".encode(), hashlib.sha256).digest()


def _read_id(path: Path) -> str:
    try:
        return path.read_text().strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return ""


def _mac(key: bytes, purpose: str, data: bytes) -> bytes:
    return hmac.new(key, purpose.encode() + b"\0" + data, hashlib.sha256).digest()


def seal(key: bytes, purpose: str, data: bytes) -> bytes:
    """`data` with its seal for `purpose` (what it is: "record of job 3", the
    returns file's name): a blob sealed for one purpose does not pass for another."""
    return _MAGIC + _mac(key, purpose, data) + data


def unseal(key: bytes, purpose: str, blob: bytes) -> bytes:
    """The data `seal` sealed for `purpose`. Raises ValueError, saying why, if
    `blob` was not sealed so with `key` (the caller names the source)."""
    head = len(_MAGIC) + _MAC_BYTES
    if blob[: len(_MAGIC)] != _MAGIC or len(blob) < head:
        raise ValueError(
            "carries no seal of this sweep (written by another launcher version, or not by "
            "this sweep's driver): nothing of it was unpickled"
        )
    data = blob[head:]
    if not hmac.compare_digest(blob[len(_MAGIC) : head], _mac(key, purpose, data)):
        raise ValueError(
            "does not verify with this sweep's key (not written by this sweep's driver as "
            f"its {purpose}, or changed since): nothing of it was unpickled"
        )
    return data


# What a pack's seal covers of what is said beside it (a sidecar in the storage,
# the driver's last log line): the pack's size and sha256 (so its content), and
# where the driver's node keeps it and the sweep's copy (which the launcher
# removes once everything is home). Not where the storage is: that is
# configured here.
_SEALED = ("size", "sha256", "node_ip", "node_id", "file", "pack_path", "cluster_sweep")


def pack_seal(key: bytes, name: str, said: Mapping[str, Any]) -> str:
    """The seal of the pack `name` and what `said` says of it (hex)."""
    fields = {k: said[k] for k in _SEALED if k in said}
    text = json.dumps({"name": name, **fields}, sort_keys=True)
    return _mac(key, "pack", text.encode()).hex()


def check_pack_seal(key: bytes, name: str, said: Mapping[str, Any]) -> None:
    """Raises ValueError unless `said["seal"]` seals the pack `name` and the
    rest of `said` (whose size and sha256 the pack was checked against)."""
    seal_said = said.get("seal")
    if not isinstance(seal_said, str) or not hmac.compare_digest(
        seal_said, pack_seal(key, name, said)
    ):
        raise ValueError(
            "does not verify with this sweep's key (not packed by this sweep's driver, or "
            "changed since): nothing of it was extracted"
        )
