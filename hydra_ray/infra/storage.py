"""`sync_down.storage`: the pack of results and outputs goes through a
storage both sides reach (S3, GCS, a shared volume): for `ray_jobs` instead of
the dashboard; for the cluster launchers so that it need not wait on a cluster
whose launcher is gone. pyarrow.fs does the I/O, as for Ray Train's
storage_path; it is imported only when a storage is given."""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra_ray.core.digest import file_digest
from hydra_ray.core.errors import ConfigError
from hydra_ray.core.redact import redacted, redacting_logger

log = redacting_logger(__name__)

KEY = "hydra.launcher.sync_down.storage"
_CHUNK = 1 << 22


def _filesystem(uri: str) -> tuple[Any, str]:
    """pyarrow's filesystem for `uri` and the path in it. Raises ImportError,
    and pyarrow's errors for a URI it cannot take."""
    from pyarrow import fs

    filesystem, path = fs.FileSystem.from_uri(uri)
    return filesystem, path.rstrip("/")


def storage_problems(uri: str | None) -> list[ConfigError]:
    """What makes `uri` unusable, found without a request to the storage."""
    if uri is None:
        return []
    try:
        _filesystem(uri)
    except ImportError:
        return [
            ConfigError(
                f"{KEY}={redacted(uri)} needs pyarrow (here and on the cluster): "
                "pip install 'hydra-ray-launcher[storage]', or pip install pyarrow"
            )
        ]
    except (ValueError, OSError) as exc:  # pyarrow: ArrowInvalid is a ValueError
        return [
            ConfigError(
                f"{KEY}={redacted(uri)} is not a storage pyarrow can open ({exc}): give "
                "s3://BUCKET/PREFIX, gs://BUCKET/PREFIX or file:///ABSOLUTE/DIR"
            )
        ]
    return []


def check_reachable(uri: str) -> None:
    """A storage this machine cannot reach is refused before the sweep is
    submitted (no such bucket or dir, wrong credentials). Raises ConfigError."""
    from pyarrow.fs import FileType

    filesystem, path = _filesystem(uri)
    local = filesystem.type_name == "local"
    # A bucket must exist; a prefix in it need not (the cluster's first write makes it).
    where = path if local else path.split("/")[0]
    try:
        found = filesystem.get_file_info(where).type
    except OSError as exc:
        raise ConfigError(
            f"{KEY}={redacted(uri)} cannot be read from here ({exc}): check the credentials "
            "pyarrow finds (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, "
            "GOOGLE_APPLICATION_CREDENTIALS, ...) and the endpoint"
        ) from None
    if found != FileType.Directory:
        what = (
            f"{where} is no dir here: the shared volume must be mounted at the same path "
            "here and on the cluster's nodes"
            if local
            else f"no bucket {where!r} is there"
        )
        raise ConfigError(f"{KEY}={redacted(uri)}: {what}")


def put(uri: str, local: Path, name: str) -> str:
    """Copy `local` to `name` under `uri`, checked by its size; its path there.
    Raises OSError (pyarrow's too) when the copy fails or comes out short."""
    filesystem, base = _filesystem(uri)
    if filesystem.type_name == "local":
        filesystem.create_dir(base, recursive=True)
    target = f"{base}/{name}"
    with open(local, "rb") as src, filesystem.open_output_stream(target) as out:
        for chunk in iter(lambda: src.read(_CHUNK), b""):
            out.write(chunk)
    stored = filesystem.get_file_info(target).size
    if stored != local.stat().st_size:
        raise OSError(f"{target} holds {stored} bytes of {local.stat().st_size}")
    return target


def fetch(uri: str, name: str, local: Path) -> None:
    filesystem, base = _filesystem(uri)
    with filesystem.open_input_stream(f"{base}/{name}") as src, open(local, "wb") as out:
        while chunk := src.read(_CHUNK):
            out.write(chunk)


def fetch_checked(where: Mapping[str, Any], local: Path) -> None:
    """The pack `where` says of ({"storage", "key", "size", "sha256"}) to
    `local`, checked. Raises OSError (pyarrow's too) when it cannot be read,
    ValueError when it arrived damaged."""
    fetch(where["storage"], where["key"], local)
    check_pack(local, where)


def check_pack(local: Path, where: Mapping[str, Any]) -> None:
    """Raises ValueError unless `local` has the size and sha256 `where` says."""
    size, sha256 = file_digest(local)
    if size != where["size"] or sha256 != where["sha256"]:
        raise ValueError(
            f"the pack arrived damaged ({size} bytes of {where['size']}, or another sha256)"
        )


def exists(uri: str, name: str) -> bool:
    """Whether `name` is in the storage. Raises OSError when it cannot be asked."""
    from pyarrow.fs import FileType

    filesystem, base = _filesystem(uri)
    return bool(filesystem.get_file_info(f"{base}/{name}").type == FileType.File)


def remove(uri: str, name: str) -> None:
    filesystem, base = _filesystem(uri)
    filesystem.delete_file(f"{base}/{name}")


def remove_quietly(uri: str, *names: str) -> None:
    """The storage's copies, once everything they held is home: a failure is
    only logged (what they held is home)."""
    for name in names:
        try:
            remove(uri, name)
        except FileNotFoundError:  # never put there (the driver could not), or removed
            continue
        except OSError as exc:
            log.warning(f"Could not remove {name} from {redacted(uri)} ({exc})")
