"""Connecting to a Ray cluster, as a user meets it in the first hour: a wrong
address, a cluster that wants a token, Ctrl-C while Ray starts. Each answer
comes in seconds, with the reason, and leaves nothing running."""

import json
import os
import secrets
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import AppRun, free_port, processes_in_session, ray_head, run_app, start_app

# Not in a fresh shell; the session's own `ray.init()` sets RAY_AUTH_MODE here.
FRESH_SHELL = ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _env(home: Path, **extra: str) -> dict[str, str]:
    """The user's environment: a HOME of their own (its ~/.ray/auth_token, if
    any, is their token) and no RAY_AUTH_MODE, as in a fresh shell."""
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    return {**env, "HOME": str(home), **extra}


def _home(tmp_path: Path, name: str, token: str | None) -> Path:
    home = tmp_path / name
    (home / ".ray").mkdir(parents=True)
    if token is not None:
        (home / ".ray" / "auth_token").write_text(token)
    return home


def _users_sweep(address: str, tmp_path: Path, token: str | None) -> AppRun:
    """`app.py x=1,2` at `address`, its sweep dir tmp_path/s, run from a fresh
    shell by a user whose ~/.ray holds `token` (none if None)."""
    return run_app(
        "app.py",
        "x=1,2",
        f"hydra.launcher.ray.init.address={address}",
        f"hydra.sweep.dir={tmp_path / 's'}",
        cwd=tmp_path,
        env=_env(_home(tmp_path, "user", token)),
        unset=FRESH_SHELL,
    )


@pytest.fixture(scope="module")
def token_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """`ray start --head` with token authentication; yields its address and token."""
    token = secrets.token_hex(32)
    home = _home(tmp_path_factory.mktemp("head"), "home", token)
    with ray_head(_env(home, RAY_AUTH_MODE="token")) as (address, _):
        yield address, token


def test_an_address_where_nothing_listens_is_refused_in_seconds(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    # Ray's own connect retries for minutes: a launcher that left it to Ray
    # would end by this deadline, without the message below.
    res = run_app(
        "app.py", "x=1", f"hydra.launcher.ray.init.address={address}", cwd=tmp_path, timeout=120
    )
    assert res.returncode != 0
    # (Ray reads 127.0.0.1 as this machine's address: the message shows both.)
    assert "No Ray cluster at" in res.output and f"address={address}" in res.output, res.output
    assert "hydra.launcher.ray.init.address" in res.output and "Connection refused" in res.output
    assert "Started a local Ray instance" not in res.output


def test_a_dashboard_address_points_to_the_gcs_address(tmp_path: Path) -> None:
    res = run_app(
        "app.py", "x=1", "hydra.launcher.ray.init.address=http://127.0.0.1:8265", cwd=tmp_path
    )
    assert res.returncode != 0
    assert "is the address of a Ray dashboard" in res.output
    assert "Started a local Ray instance" not in res.output


def test_this_machines_token_is_used_when_the_cluster_asks_for_one(
    token_cluster: tuple[str, str], tmp_path: Path
) -> None:
    address, token = token_cluster
    res = _users_sweep(address, tmp_path, token)
    assert res.returncode == 0, res.output
    assert "requires a token: using this machine's (RAY_AUTH_MODE=token)" in res.output
    assert "2 jobs done" in res.output


@pytest.mark.parametrize(
    ("token", "says"),
    [
        (None, "requires a token and this machine has none"),
        ("not-the-token", "refused this machine's token"),
    ],
    ids=["no token", "wrong token"],
)
def test_a_missing_or_wrong_token_is_refused_in_seconds_with_the_reason(
    token_cluster: tuple[str, str], tmp_path: Path, token: str | None, says: str
) -> None:
    address, _ = token_cluster
    res = run_app(
        "app.py",
        "x=1",
        f"hydra.launcher.ray.init.address={address}",
        cwd=tmp_path,
        env=_env(_home(tmp_path, "user", token)),
        unset=FRESH_SHELL,
        timeout=60,
    )
    assert res.returncode != 0
    # Our words, not Ray's C++ log (nor its "Failed to connect", after 20 s).
    assert says in res.output, res.output
    assert "ray get-auth-token" in res.output
    assert "Unauthenticated" not in res.output, res.output
    assert "Failed to connect" not in res.output, res.output


@pytest.mark.parametrize("after_s", [0.5, 2.0])
def test_ctrl_c_while_ray_starts_exits_130_at_once_and_leaves_nothing(
    tmp_path: Path, after_s: float
) -> None:
    # The job would sleep for 5 minutes: a launcher that waited for it, or for
    # anything else, ends by the deadline below, not by the Ctrl-C.
    with start_app("app.py", "x=1", "seconds=300", cwd=tmp_path) as run:
        run.wait_for("Initializing ray")
        time.sleep(after_s)
        output = run.end(signal.SIGINT)
        assert run.returncode in (130, -signal.SIGINT), output
        assert list(tmp_path.rglob("done_*")) == [], output
        deadline = time.monotonic() + 5
        while processes_in_session(run.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = processes_in_session(run.pid)
        assert left == [], "\n".join(left)


# On the head: the first per-client server of its Ray Client server dies at
# start, as one can on a busy head; the next one starts.
_FIRST_CLIENT_SERVER_DIES = """
import os, sys
if "--mode=specific-server" in sys.argv:
    try:
        os.close(os.open(os.environ["FAULT_MARKER"], os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    else:
        os._exit(1)
"""


def test_a_ray_client_server_that_fails_to_start_a_server_once_is_tried_again(
    tmp_path: Path,
) -> None:
    fault = tmp_path / "fault"
    fault.mkdir()
    (fault / "sitecustomize.py").write_text(_FIRST_CLIENT_SERVER_DIES)
    marker = tmp_path / "died-once"
    head_env = _env(
        _home(tmp_path, "head", None),
        PYTHONPATH=os.pathsep.join([str(fault), os.environ.get("PYTHONPATH", "")]),
        FAULT_MARKER=str(marker),
        # How long the proxy waits for a per-client server to listen (three
        # times for one that died): short, as the first one never will, but not
        # so short that a loaded machine's next one (Python and Ray's imports,
        # 1 s idle, a few under load) misses it; a miss is tried again anyway.
        RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S="8",
    )
    res, head_logs = _sweep_through_ray_client(tmp_path, head_env)
    assert marker.exists(), "the fault did not strike:\n" + res.output + head_logs
    assert res.returncode == 0, res.output + head_logs
    assert "could not start a server for this client (try 1 of 4)" in res.output
    assert "2 jobs done" in res.output
    assert (tmp_path / "s" / "1" / "done_1.json").is_file()


# What Ray's proxy sent back when the server died while it looked at it (seen
# under load): its traceback, ending in psutil's error.
_ZOMBIE = (
    "Initialization failure from server:\nTraceback (most recent call last):\n"
    '  File "proxier.py", line 396, in start_specific_server\n'
    "psutil.ZombieProcess: PID still exists but it's a zombie (pid=26933)"
)


@pytest.mark.parametrize(
    "error, tried_again",
    [(ConnectionAbortedError(_ZOMBIE), True), (ConnectionError("Connection refused"), False)],
)
def test_which_ray_client_failures_at_start_are_tried_again(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: ConnectionError,
    tried_again: bool,
) -> None:
    """A unit test beside the one above, with a fake ray.init: a per-client
    server that died (in any of the ways Ray reports it) is tried again; other
    connection errors are the user's to see at once."""
    import ray

    from hydra_ray.launch import local as _local

    calls: list[dict[str, str]] = []

    def init(**kwargs: str) -> None:
        calls.append(kwargs)
        if len(calls) == 1:
            raise error

    monkeypatch.setattr(ray, "init", init)
    # _init shuts down what a failed try left: here, that would be the test
    # session's own Ray (the other tests' sweeps connect to it).
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    monkeypatch.setattr(time, "sleep", lambda s: None)
    if tried_again:
        _local._init({"address": "ray://head:10001"})
        assert len(calls) == 2
        assert "could not start a server for this client (try 1 of 4)" in caplog.text
        assert "psutil.ZombieProcess" in caplog.text  # Ray's words, the last line
    else:
        with pytest.raises(ConnectionError, match="Connection refused"):
            _local._init({"address": "ray://head:10001"})
        assert len(calls) == 1


def _sweep_through_ray_client(tmp_path: Path, head_env: dict[str, str]) -> tuple[AppRun, str]:
    """`app.py x=1,2` through Ray Client to a `ray start` head in `head_env`, its
    sweep dir tmp_path/s; the run, and the head's Ray Client server logs."""
    client_port = free_port()
    head_temp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths
    try:
        with ray_head(head_env, client_port=client_port, temp_dir=head_temp):
            res = _users_sweep(f"ray://127.0.0.1:{client_port}", tmp_path, None)
        return res, _client_server_logs(Path(head_temp))
    finally:
        shutil.rmtree(head_temp, ignore_errors=True)


def _client_server_logs(temp_dir: Path) -> str:
    """The head's Ray Client server logs: what a failure of the test above needs."""
    logs = sorted(temp_dir.glob("session_latest/logs/ray_client_server*"))
    return "".join(f"\n== {p.name}\n{p.read_text(errors='replace')[-4000:]}" for p in logs)


# On the head: this checkout (where the plugin is installed from) is off every
# process's sys.path, as on a cluster that lacks the plugin; each worker notes
# where it would import hydra_ray from ("-": nowhere).
_PLUGIN_NOT_INSTALLED = """
import importlib.util, os, sys
checkout = os.environ["HIDDEN_CHECKOUT"]
sys.path[:] = [p for p in sys.path if os.path.realpath(p or ".") != checkout]
if any(a.endswith("default_worker.py") for a in sys.argv):
    spec = importlib.util.find_spec("hydra_ray")
    notes = os.environ["WORKER_NOTES"]
    with open(os.path.join(notes, str(os.getpid())), "w") as f:
        f.write(spec.origin if spec and spec.origin else "-")
"""


def test_ray_client_ships_the_plugin_to_a_cluster_that_lacks_it(tmp_path: Path) -> None:
    """Through Ray Client the jobs run this machine's plugin (both packages, in
    the runtime_env's py_modules), on a cluster where it is not installed."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(_PLUGIN_NOT_INSTALLED)
    notes = tmp_path / "notes"
    notes.mkdir()
    checkout = os.path.realpath(Path(__file__).parent.parent)
    head_env = _env(
        _home(tmp_path, "head", None),
        PYTHONPATH=os.pathsep.join([str(hide), os.environ.get("PYTHONPATH", "")]),
        HIDDEN_CHECKOUT=checkout,
        WORKER_NOTES=str(notes),
    )
    res, head_logs = _sweep_through_ray_client(tmp_path, head_env)
    assert res.returncode == 0, res.output + head_logs
    assert "2 jobs done" in res.output
    assert (tmp_path / "s" / "1" / "done_1.json").is_file()
    found = {note.read_text() for note in notes.iterdir()}
    # The workers that ran the jobs found the shipped copy; none found this checkout.
    assert any("runtime_resources" in where for where in found), found
    assert not any(where.startswith(checkout) for where in found), found


def test_a_ray_started_here_with_ray_start_is_found_with_nothing_set(tmp_path: Path) -> None:
    """The warm path: `ray start --head` with token authentication on this
    machine, then sweeps with no address, no RAY_ADDRESS and no RAY_AUTH_MODE
    (the token in ~/.ray/auth_token): each runs on that Ray, which stays up
    for the next, and none starts a Ray of its own."""
    token = secrets.token_hex(32)
    home = _home(tmp_path, "home", token)
    # This machine's temp root, where `ray start` says where it runs (as
    # /tmp/ray does by default): private, so that no other Ray here finds it.
    root = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))
    env = _env(home, RAY_TMPDIR=str(root))
    try:
        with ray_head({**env, "RAY_AUTH_MODE": "token"}, temp_dir=str(root / "ray")) as (_, sid):
            for sweep in ("first", "second"):
                out = tmp_path / sweep
                res = run_app(
                    "app.py",
                    "x=1,2",
                    f"out={out}",
                    f"hydra.sweep.dir={tmp_path / 's' / sweep}",
                    cwd=tmp_path,
                    env=env,
                    unset=FRESH_SHELL,
                )
                assert res.returncode == 0, res.output
                assert "Started a local Ray instance" not in res.output
                assert "requires a token: using this machine's" in res.output
                # Not Ray's C++ log of the probe's refusal before that line.
                assert "Unauthenticated" not in res.output, res.output
                ran_in = {json.loads(p.read_text())["sid"] for p in out.glob("done_*.json")}
                assert ran_in == {sid}, res.output  # the jobs ran in that Ray's workers
                assert processes_in_session(sid), "the Ray stopped with the sweep"
    finally:
        shutil.rmtree(root, ignore_errors=True)
