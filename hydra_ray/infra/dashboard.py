"""The client side of a Ray cluster's dashboard, for the `ray_jobs` launcher:
where it is (hydra.launcher.address, or the variables `ray job submit`
reads), the token Ray's own clients would send and when it may go, Ray's
`JobSubmissionClient` made with both, and a file fetched through the
dashboard's log API."""

import asyncio
import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra_ray.core.errors import ConfigError
from hydra_ray.core.settings import JobsSettings
from hydra_ray.core.wire import LOWEST_CLUSTER_RAY_TEXT, older_than_lowest_ray
from hydra_ray.infra.storage import check_pack

# Ray refuses a larger working_dir upload (HTTP 413); 100 MiB today.
UPLOAD_LIMIT = 100 * 2**20


def lost_connection() -> tuple[type[BaseException], ...]:
    """What a broken connection to the dashboard raises while a job's log is
    followed: Ray's client (RuntimeError on an abnormal close), aiohttp, the socket."""
    import aiohttp

    return (RuntimeError, OSError, asyncio.TimeoutError, aiohttp.ClientError)


@dataclass
class Dashboard:
    """Where and how to reach the cluster's dashboard. `token` (found where Ray's
    clients find it; `token_from` says where) goes with every request only once
    the dashboard has asked for one (401/403 without it), or at once under
    RAY_AUTH_MODE=token; over plain http to another machine, only with
    `token_over_http`. A token in the user's own headers goes as they say."""

    address: str
    user_headers: dict[str, str]
    verify: bool | str
    token: str | None = None
    token_from: str | None = None
    token_over_http: bool = False
    sends_token: bool = False

    @property
    def headers(self) -> dict[str, str]:
        """Every request's headers: the user's, and the token once it is sent."""
        if self.sends_token and self.token is not None:
            return {**self.user_headers, "Authorization": f"Bearer {self.token}"}
        return dict(self.user_headers)

    def client(self) -> Any:
        """Ray's client, its first request made: a dashboard that cannot be
        reached, or that refuses the token, is named here, before any upload.
        Raises ConfigError."""
        if self.token is not None and os.environ.get("RAY_AUTH_MODE") == "token":
            self._send_token()
        try:
            client = self._connect()
        except _AsksForToken as asked:
            if self.token is None or self.sends_token:
                raise ConfigError(self._refused(asked.said)) from None
            self._send_token()
            try:
                client = self._connect()
            except _AsksForToken as again:
                raise ConfigError(self._refused(again.said)) from None
        self._check_ray_version()
        return client

    def _connect(self) -> Any:
        from ray.job_submission import JobSubmissionClient

        from hydra_ray.infra.connect import auth_error

        AuthenticationError = auth_error()

        try:
            return JobSubmissionClient(self.address, headers=self.headers, verify=self.verify)
        except AuthenticationError as exc:
            raise _AsksForToken(str(exc)) from None
        except ConnectionError:
            raise ConfigError(
                f"Cannot reach the dashboard at {self.address} (hydra.launcher.address): is "
                "the cluster up, and the port-forward (`kubectl port-forward "
                "svc/<cluster>-head-svc 8265:8265`) running?"
            ) from None
        except (RuntimeError, OSError) as exc:  # an HTTP answer, not the Jobs API's
            status = getattr(getattr(exc, "response", None), "status_code", None)
            if status in (401, 403):  # a Ray without token authentication's client
                raise _AsksForToken(f"HTTP {status}") from None
            raise ConfigError(
                f"{self.address} (hydra.launcher.address) answered, but not as a Ray "
                f"dashboard's Jobs API ({exc}): give the dashboard's port (8265 by default)"
            ) from None

    def _send_token(self) -> None:
        """From now on the token goes with every request. Raises ConfigError where
        it would cross the network in clear without the user's say-so."""
        url = urllib.parse.urlsplit(self.address)
        if url.scheme == "http" and not _loopback(url.hostname) and not self.token_over_http:
            raise ConfigError(
                f"The dashboard at {self.address} asks for a token, and this machine's (from "
                f"{self.token_from}) would cross the network in clear (http to another "
                "machine). Reach the dashboard over https, or through a port-forward to "
                "127.0.0.1, or set hydra.launcher.token_over_http=true to send it anyway"
            )
        self.sends_token = True

    def _check_ray_version(self) -> None:
        """Refuse a cluster whose Ray is older than the lowest this plugin works
        with, as the dashboard's /api/version tells it. Raises ConfigError."""
        import requests

        try:
            answer = requests.get(
                f"{self.address}/api/version", headers=self.headers, verify=self.verify, timeout=30
            )
            running = str(answer.json().get("ray_version") or "")
        except (OSError, ValueError, AttributeError):
            return  # Ray's client took this dashboard; a late blip is no reason to refuse
        if older_than_lowest_ray(running):
            lowest = LOWEST_CLUSTER_RAY_TEXT
            raise ConfigError(
                f"The cluster at {self.address} (hydra.launcher.address) runs Ray {running}: "
                f"the ray_jobs launcher needs Ray {lowest} or later on the cluster (its driver "
                f"and the dashboard's APIs it uses). Use a cluster image with Ray >= {lowest}, "
                "ideally the Ray of this machine"
            )

    def _refused(self, said: str) -> str:
        fix = (
            "Set RAY_AUTH_TOKEN to the cluster's token (`ray get-auth-token` on its head; "
            "on KubeRay, the RayCluster's auth secret), or write it to ~/.ray/auth_token, or "
            "give +hydra.launcher.headers.Authorization='Bearer <token>'"
        )
        if self.token_from is None:
            return (
                f"The dashboard at {self.address} requires a token (Ray's token "
                f"authentication) and none was found to send. {fix}"
            )
        reason = "refused" if "403" in said or "Invalid" in said else f"did not take ({said})"
        return (
            f"The dashboard at {self.address} {reason} the token from {self.token_from}: it is "
            f"not this cluster's. {fix}"
        )


class _AsksForToken(Exception):
    """The dashboard answered 401 or 403: it wants a token, or another."""

    def __init__(self, said: str):
        super().__init__(said)
        self.said = said


def _loopback(host: str | None) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host or "").is_loopback
    except ValueError:  # a name: it may resolve to anywhere
        return False


# Whose value is the user's own token: sent as it is, no other is added.
_AUTH_HEADERS = ("authorization", "x-ray-authorization")


def _found_token() -> tuple[str | None, str | None]:
    """The bearer token Ray's own clients would send, found as they find it
    (RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH names, ~/.ray/auth_token),
    whatever RAY_AUTH_MODE says, and where it was found; (None, None) if none.
    Raises ConfigError."""
    token, source = os.environ.get("RAY_AUTH_TOKEN", "").strip(), "RAY_AUTH_TOKEN"
    if not token:
        named = os.environ.get("RAY_AUTH_TOKEN_PATH")
        path = Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"
        source = f"RAY_AUTH_TOKEN_PATH={named}" if named else str(path)
        try:
            token = path.read_text().strip()
        except FileNotFoundError:
            if named:
                raise ConfigError(
                    f"RAY_AUTH_TOKEN_PATH={named}: no such file. Point it at the file that "
                    "holds the cluster's token, or unset it"
                ) from None
        except OSError as exc:
            raise ConfigError(f"Cannot read the token file {path} ({exc})") from None
    return (token, source) if token else (None, None)


def dashboard_address(settings: JobsSettings) -> str:
    """hydra.launcher.address, else RAY_API_SERVER_ADDRESS, else an http(s)
    RAY_ADDRESS (as `ray job submit`). Raises ConfigError."""
    address = settings.address
    key = "hydra.launcher.address"
    if address is None:
        for var in ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS"):
            value = os.environ.get(var, "")
            if value.startswith(("http://", "https://")):
                return value.rstrip("/")
        raise ConfigError(
            f"{key} is not set: give the cluster's dashboard, e.g. "
            f"{key}=http://127.0.0.1:8265 (after `kubectl port-forward "
            "svc/<cluster>-head-svc 8265:8265`), or set RAY_API_SERVER_ADDRESS"
        )
    if address.startswith("ray://") or not address.startswith(("http://", "https://")):
        raise ConfigError(
            f"{key}={address} is not a dashboard address: the ray_jobs launcher talks to the "
            "dashboard, http(s)://HOST:8265. For a Ray Client (ray://HOST:10001) or GCS "
            "(HOST:6379) address, use hydra/launcher=ray with "
            "hydra.launcher.ray.init.address=..."
        )
    return address.rstrip("/")


def dashboard_for(settings: JobsSettings) -> Dashboard:
    """The dashboard hydra.launcher's keys name, and how to reach it. Raises
    ConfigError (headers, verify, the address, a token file that is not there)."""
    headers = settings.headers if settings.headers is not None else {}
    if not isinstance(headers, dict):
        # Its value is likely a secret (a token): not shown.
        raise ConfigError(
            "hydra.launcher.headers is not valid: it is a mapping of header names to values, "
            "e.g. +hydra.launcher.headers.Authorization='Bearer <token>' (or "
            "hydra.launcher.headers='{Authorization: \"Bearer <token>\"}')"
        )
    verify = settings.verify
    if not isinstance(verify, (bool, str)):
        raise ConfigError(
            f"hydra.launcher.verify={verify} is not valid: true, false, or a CA bundle's path"
        )
    if isinstance(verify, str) and not os.path.exists(os.path.expanduser(verify)):
        raise ConfigError(
            f"hydra.launcher.verify={verify}: no such CA bundle (file or dir) on this machine. "
            "Give the path of the CA bundle that signed the dashboard's certificate, or true "
            "for the system's CAs"
        )
    verify = os.path.expanduser(verify) if isinstance(verify, str) else verify
    given = {str(k): str(v) for k, v in headers.items()}
    address = dashboard_address(settings)
    if any(k.lower() in _AUTH_HEADERS for k in given):  # the user's own: sent as it is
        return Dashboard(address, given, verify, token_from="hydra.launcher.headers")
    token, token_from = _found_token()
    over_http = bool(settings.token_over_http)
    return Dashboard(address, given, verify, token, token_from, over_http)


def download(dashboard: Dashboard, where: Mapping[str, Any], local: Path) -> None:
    """The pack, from the dashboard's log API, checked (size, sha256).

    `format=text` asks for the file as it is: Ray 2.33 to 2.44 put a "1" before
    each chunk otherwise (the framing of `ray logs`); later Rays send the file
    as it is and ignore the parameter."""
    import requests

    query = urllib.parse.urlencode(
        {
            "node_id": where["node_id"],
            "filename": where["file"],
            "lines": -1,
            "timeout": 600,
            "format": "text",
        }
    )
    headers = dict(dashboard.headers)  # the user's, and the token if any
    url = f"{dashboard.address}/api/v0/logs/file?{query}"
    with requests.get(url, stream=True, headers=headers, verify=dashboard.verify, timeout=60) as r:
        if r.status_code != 200:
            raise ValueError(f"the dashboard answered {r.status_code}: {r.text[:300]}")
        with open(local, "wb") as out:
            for chunk in r.iter_content(chunk_size=1 << 20):
                out.write(chunk)
    check_pack(local, where)
