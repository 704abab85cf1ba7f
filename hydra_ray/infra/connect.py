"""Checks of the cluster `ray.init()` is about to connect to, made in seconds
before Ray's own connect, which retries for 20 s and more and then says only
"Failed to connect": is anything listening there, does the cluster want a token,
and does it take the one this machine has.

The token is found as Ray's own CLI finds it (`RAY_AUTH_TOKEN`,
`RAY_AUTH_TOKEN_PATH`, `~/.ray/auth_token`): with `RAY_AUTH_MODE` unset, a
cluster that asks for a token gets this machine's.

Ray is imported inside functions, where it is needed.
"""

import contextlib
import os
import socket
import sys
import tempfile
from collections.abc import Iterator, Mapping
from typing import Any

from hydra_ray.core.errors import ConfigError
from hydra_ray.core.redact import redacting_logger

log = redacting_logger(__name__)

_KEY = "hydra.launcher.ray.init.address"
_PROBE_TIMEOUT_S = 10.0
_TOKEN_HELP = (
    "Put the cluster's token (on its head: `ray get-auth-token`) in ~/.ray/auth_token or "
    "RAY_AUTH_TOKEN on this machine"
)


def check_connection(init: Mapping[str, Any]) -> None:
    """Refuse, with the reason, an address ray.init() could not connect to; turn
    token authentication on when the cluster wants it and this machine has a token.

    `init` holds the keyword arguments for ray.init(). Nothing happens for a new
    local Ray. Raises ConfigError."""
    address = init.get("address")
    where = _KEY
    if os.environ.get("RAY_ADDRESS"):
        address, where = os.environ["RAY_ADDRESS"], "RAY_ADDRESS"
    if isinstance(address, str) and address.startswith(("http://", "https://")):
        raise ConfigError(
            f"{where}={address} is the address of a Ray dashboard (the Jobs API), which "
            "ray.init() cannot use: to run the sweep through the dashboard, use "
            f"hydra/launcher=ray_jobs hydra.launcher.address={address}; or give the "
            "cluster's GCS address HOST:6379 (from a node of the cluster) or "
            "ray://HEAD:10001 (Ray Client, from elsewhere)"
        )
    if isinstance(address, str) and address.startswith("ray://"):
        host, _, port = address[len("ray://") :].rpartition(":")
        _check_listening(host, int(port) if port.isdigit() else 10001, where, address)
        return
    gcs = _gcs_address(address, init.get("_temp_dir"))
    if gcs is None:
        return  # a new local Ray
    if address in (None, "auto"):
        where = "the cluster that `ray start` started on this machine (/tmp/ray)"
    elif gcs != address:
        where += f"={address}"  # Ray reads localhost as this machine's address
    host, _, port = gcs.rpartition(":")
    _check_listening(host, int(port), where, gcs)
    _check_token(gcs, where)


def _gcs_address(address: Any, temp_dir: Any) -> str | None:
    """Ray's own reading of an address: HOST:PORT of the GCS, or None for a new
    local Ray (no address, and no `ray start` cluster on this machine)."""
    from ray._private.services import canonicalize_bootstrap_address

    try:
        return canonicalize_bootstrap_address(address, temp_dir=temp_dir)
    except (ValueError, ConnectionError) as exc:
        raise ConfigError(f"{_KEY}={address} is not a Ray address: {exc}") from None


def _check_listening(host: str, port: int, where: str, address: str) -> None:
    try:
        with socket.create_connection((host, port), timeout=_PROBE_TIMEOUT_S):
            return
    except OSError as exc:
        reason = "nothing answered" if isinstance(exc, TimeoutError) else str(exc)
    raise ConfigError(
        f"No Ray cluster at {address} ({where}): {reason}. Start it (`ray start --head`), "
        f"or fix the address (HOST:PORT of the head's GCS, 6379 by default; "
        f"ray://HOST:10001 for Ray Client)"
    )


class _NoTokenAuthentication(Exception):
    """Stands for Ray's AuthenticationError on a Ray without it: never raised."""


def auth_error() -> type[Exception]:
    """Ray's AuthenticationError (token authentication: Ray 2.52 and later); on
    an older Ray, a class that nothing raises."""
    try:
        from ray.exceptions import AuthenticationError
    except ImportError:
        return _NoTokenAuthentication
    return AuthenticationError


def _check_token(gcs: str, where: str) -> None:
    """Ask the GCS for one value, as Ray would at connect, without its retries."""
    try:
        from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    except ImportError:  # a Ray without token authentication: only whether it is a GCS
        _probe_gcs(gcs, where)
        return
    AuthenticationError = auth_error()

    mode = os.environ.get("RAY_AUTH_MODE")
    try:
        _probe_gcs(gcs, where)
        return
    except AuthenticationError:
        if mode is not None and mode.lower() == "token":
            raise ConfigError(
                f"The Ray cluster at {gcs} ({where}) refused this machine's token "
                f"(RAY_AUTH_MODE=token). {_TOKEN_HELP}."
            ) from None
        if mode is not None:
            raise ConfigError(
                f"The Ray cluster at {gcs} ({where}) requires a token, and RAY_AUTH_MODE={mode} "
                "here turns tokens off: unset it (this machine's token is then used) or set "
                "RAY_AUTH_MODE=token"
            ) from None
        if not AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True):
            raise ConfigError(
                f"The Ray cluster at {gcs} ({where}) requires a token and this machine has none. "
                f"{_TOKEN_HELP}."
            ) from None
    # As Ray's CLI does: RAY_AUTH_MODE unset and a token here -> use it.
    _enable_token_auth()
    log.info(
        f"The Ray cluster at {gcs} requires a token: using this machine's (RAY_AUTH_MODE=token)"
    )
    try:
        _probe_gcs(gcs, where)
    except AuthenticationError:
        raise ConfigError(
            f"The Ray cluster at {gcs} ({where}) refused this machine's token. {_TOKEN_HELP}."
        ) from None


def _probe_gcs(gcs: str, where: str) -> None:
    """Raises AuthenticationError if the GCS wants another token (or one)."""
    from ray._raylet import GcsClient  # type: ignore[attr-defined]

    AuthenticationError = auth_error()

    try:
        with _refusals_unprinted():
            GcsClient(address=gcs).internal_kv_get(
                b"session_name", b"session", timeout=_PROBE_TIMEOUT_S
            )
    except AuthenticationError:
        raise
    except Exception as exc:  # Ray's RPC errors have no common public base
        raise ConfigError(
            f"Something listens at {gcs} ({where}) but does not answer as a Ray cluster's "
            f"GCS ({type(exc).__name__}: {exc}). Give the head's GCS address (port 6379 by "
            "default, `ray start --head --port`)"
        ) from None


@contextlib.contextmanager
def _refusals_unprinted() -> Iterator[None]:
    """Ray's C++ core logs a refused token to stderr ("Failed to get cluster ID
    from GCS server: Unauthenticated"), on every sweep to a token cluster before
    this module turns the token on, and before its own words when that fails:
    those lines are dropped, whatever else it wrote is printed."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr: nothing to keep clean
        yield
        return
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            words = caught.read().decode(errors="replace").splitlines(keepends=True)
            sys.stderr.write("".join(w for w in words if "Unauthenticated" not in w))


def _enable_token_auth() -> None:
    from ray._raylet import Config  # type: ignore[attr-defined]

    os.environ["RAY_AUTH_MODE"] = "token"
    Config.initialize("")  # Ray's C++ side reads the mode from its config
