"""What comes home from a cluster or a storage is unpickled or untarred only
when it verifies as this sweep's (core.seal): a storage writer, a cluster or a
dashboard can make the launcher refuse, never run code here. Each hostile file
below would create a marker file when unpickled; none is created.

The genuine path is the head driver's own: its records and returns written
and its pack stored by `hydra_ray.driver.head` with the sweep's key, brought
home by the cluster launchers' resume (`_from_storage`) and by `ray_jobs`
(`_bring_pack_home`), through a shared dir (file://) and through S3 (moto)."""

import hashlib
import io
import json
import os
import pickle
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobReturn, JobStatus

from hydra_ray.core.errors import Unauthentic
from hydra_ray.core.jobs import Job, JobOutcome, Policy
from hydra_ray.core.records import RECORD_DIR, read_record, write_manifest, write_record
from hydra_ray.core.settings import SyncDown
from hydra_ray.core.wire import PACK_MARK, RETURNS
from hydra_ray.driver import head
from hydra_ray.driver.protocol import PackPlan, dump_outcomes, stored_sidecar
from hydra_ray.infra.dashboard import Dashboard
from hydra_ray.launch import jobs_api
from hydra_ray.launch.cluster import _from_storage
from hydra_ray.launch.sweep import SweepBook, SweepSettings

from .cluster_harness.moto import MotoServer, moto_server
from .conftest import SMALL_RAY, run_app, sweep_key_of

BUCKET = "packs"


class _Payload:
    """What a hostile pickle does when it is loaded: create `marker`."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def _hostile_pickle(marker: Path) -> bytes:
    return pickle.dumps(_Payload(marker))


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    with moto_server(tmp_path_factory.mktemp("moto-home"), region="us-east-1") as server:
        server.client("s3").create_bucket(Bucket=BUCKET)
        yield server


@pytest.fixture(params=["file", "s3"])
def storage(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A storage both the 'head' and this machine reach: a shared dir, or S3."""
    if request.param == "file":
        shared = tmp_path / "shared"
        shared.mkdir()
        return f"file://{shared}"
    server: MotoServer = request.getfixturevalue("s3_server")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        if name in server.env:
            monkeypatch.setenv(name, server.env[name])
    host = server.endpoint.removeprefix("http://")
    prefix = f"{BUCKET}/{tmp_path.name}"
    return f"s3://{prefix}?endpoint_override={host}&scheme=http&region={server.region}"


def _put(storage: str, name: str, data: bytes, tmp_path: Path) -> None:
    from hydra_ray.infra.storage import put

    local = tmp_path / f"upload-{name}"
    local.write_bytes(data)
    put(storage, local, name)


def _book(sweep: Path) -> SweepBook:
    """The launcher's book of a sweep resumed in `sweep` (its key derived)."""
    book = SweepBook(sweep, ["x=1,2"], SweepSettings(True, False, Policy()))
    write_manifest(sweep, ["x=1,2"], {0: ["x=1"], 1: ["x=2"]})
    book.plan([Job(0, ["x=1"]), Job(1, ["x=2"])], dry=True)
    book.plan([Job(0, ["x=1"]), Job(1, ["x=2"])])
    return book


def _outcome(idx: int, value: Any) -> JobOutcome:
    ret = JobReturn(overrides=[f"x={idx + 1}"], status=JobStatus.COMPLETED)
    ret.return_value = value
    return JobOutcome(idx, ret, 0.0, 1.0, "10.0.0.3")


def _sync_down(storage: str | None) -> SyncDown:
    return SyncDown(target_dir=None, include=[], exclude=[], storage=storage)


def _head_stores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, storage: str, key: bytes, name: str
) -> None:
    """What the head driver leaves in the storage at a batch's end: the records
    and returns of jobs 0 and 1 and their outputs, packed and sealed."""
    on_head = tmp_path / "head"
    (on_head / "sweep" / "0").mkdir(parents=True)
    (on_head / "sweep" / "0" / "model.txt").write_text("weights")
    outcomes = [_outcome(0, 0.5), _outcome(1, 0.25)]
    for outcome in outcomes:
        write_record(on_head / "sweep", outcome, key)
    (on_head / RETURNS).write_bytes(dump_outcomes(outcomes, key))
    monkeypatch.chdir(on_head)
    head.store_pack(PackPlan(name, "sweep", [], [], storage), key)
    assert (on_head / "stored.json").is_file()  # stored, or the test proves nothing


def test_a_genuine_pack_in_the_storage_comes_home_on_resume(
    storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "sweep"
    book = _book(sweep)
    _head_stores(tmp_path, monkeypatch, storage, book.key, "c-1.tar")
    noted = {"storage": storage, "key": "c-1.tar"}
    scratch = tmp_path / "scratch"
    scratch.mkdir()

    outcomes = _from_storage(noted, _sync_down(storage), book, scratch)

    assert outcomes is not None
    assert [(o.idx, o.job_return.return_value) for o in outcomes] == [(0, 0.5), (1, 0.25)]
    assert (sweep / "0" / "model.txt").read_text() == "weights"
    record = read_record(sweep, 1, book.key)
    assert record is not None and record.job_return.return_value == 0.25


def test_a_tampered_byte_in_a_genuine_pack_is_refused_before_anything_is_extracted(
    storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whoever can write the storage changes the pack and the size and sha256
    beside it to match: the seal does not."""
    from hydra_ray.infra.storage import fetch

    sweep = tmp_path / "sweep"
    book = _book(sweep)
    _head_stores(tmp_path, monkeypatch, storage, book.key, "c-1.tar")
    fetch(storage, "c-1.tar", tmp_path / "pack")
    pack = bytearray((tmp_path / "pack").read_bytes())
    at = pack.index(b"weights")
    pack[at] ^= 0x20
    sidecar = json.loads((tmp_path / "head" / "stored.json").read_text())
    sidecar.update(sha256=hashlib.sha256(pack).hexdigest())
    with pytest.raises(Unauthentic, match=r"c-1\.tar from .*does not verify"):
        _resume_from(storage, bytes(pack), sidecar, tmp_path, book)
    assert not (sweep / "0").exists()
    assert read_record(sweep, 0, book.key) is None


def _resume_from(
    storage: str, pack: bytes, sidecar: dict[str, Any], tmp_path: Path, book: SweepBook
) -> None:
    """A resume that finds `pack` and `sidecar` in the storage as the driver
    noted for it (c-1.tar), as whoever wrote them there left them."""
    _put(storage, "c-1.tar", pack, tmp_path)
    _put(storage, stored_sidecar("c-1.tar"), json.dumps(sidecar).encode(), tmp_path)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    noted = {"storage": storage, "key": "c-1.tar"}
    _from_storage(noted, _sync_down(storage), book, scratch)


def _crafted_pack(marker: Path) -> bytes:
    """A pack as a hostile writer makes one: returns and a record that run code."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name in (RETURNS, "records/job_0.pkl"):
            data = _hostile_pickle(marker)
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _hostile(tmp_path: Path, name: str) -> tuple[Path, bytes, Path, dict[str, Any]]:
    """The marker a hostile pickle would create, its crafted pack (also put in
    a dir `elsewhere`, as `name`), and what a writer without the key says of
    the pack: its true size and sha256, a seal made up."""
    marker = tmp_path / "PWNED"
    pack = _crafted_pack(marker)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / name).write_bytes(pack)
    said = {"size": len(pack), "sha256": hashlib.sha256(pack).hexdigest(), "seal": "ab" * 32}
    return marker, pack, elsewhere, said


def test_a_hostile_pack_and_sidecar_in_the_storage_run_nothing_here(
    storage: str, tmp_path: Path
) -> None:
    """A pack and a sidecar that match each other, written by someone without
    the sweep's key; the sidecar also names another storage and key to follow."""
    sweep = tmp_path / "sweep"
    book = _book(sweep)
    marker, pack, elsewhere, said = _hostile(tmp_path, "other.tar")
    sidecar = {**said, "storage": f"file://{elsewhere}", "key": "other.tar"}
    with pytest.raises(Unauthentic, match=r"does not verify with this sweep's key"):
        _resume_from(storage, pack, sidecar, tmp_path, book)
    assert not marker.exists()
    assert not (sweep / RECORD_DIR / "job_0.pkl").exists()
    assert (elsewhere / "other.tar").is_file()  # not followed, not removed
    from hydra_ray.infra.storage import exists

    assert exists(storage, "c-1.tar")  # nothing removed that did not come home


def test_a_ray_job_s_log_line_names_no_storage_and_no_pack_here(
    storage: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ray_jobs: the driver's last log line comes from the cluster. A line that
    names another storage and key is not followed there; the pack named as this
    submission's in the configured storage is checked by its seal."""
    sweep = tmp_path / "sweep"
    book = _book(sweep)
    marker, pack, elsewhere, said = _hostile(tmp_path, "evil.tar")
    said.update(node_ip="10.0.0.2", cluster_sweep=None)
    dashboard = Dashboard("http://127.0.0.1:1", {}, True)
    line = {**said, "storage": f"file://{elsewhere}", "key": "evil.tar"}
    where = jobs_api._pack_location(f"{PACK_MARK}{json.dumps(line)}\n")

    # No storage configured here: the one the line names is not read.
    with pytest.raises(Exception, match=r"did not come home"):
        jobs_api._bring_pack_home(dashboard, "sub-1", where, _sync_down(None), book, tmp_path)
    # The configured storage, holding a crafted pack under this submission's name.
    _put(storage, "sub-1.tar", pack, tmp_path)
    with pytest.raises(Unauthentic, match=r"sub-1\.tar from .*does not verify"):
        jobs_api._bring_pack_home(dashboard, "sub-1", where, _sync_down(storage), book, tmp_path)
    assert not marker.exists()
    assert (elsewhere / "evil.tar").is_file()
    from hydra_ray.infra.storage import exists

    assert exists(storage, "sub-1.tar")
    assert not (sweep / RECORD_DIR / "job_0.pkl").exists()


def test_a_resume_refuses_a_planted_record_before_ray_starts_and_runs_nothing_of_it(
    tmp_path: Path,
) -> None:
    """A record in the sweep dir that this sweep's driver did not write (anybody
    who can write there, or a launcher before seals) is named in the refusal;
    it is not unpickled."""
    sweep = tmp_path / "sweep"
    overrides = ["x=1,2", f"hydra.sweep.dir={sweep}", "hydra/launcher=ray", *SMALL_RAY]
    first = run_app("app.py", *overrides, cwd=tmp_path)
    assert first.returncode == 0, first.output
    marker = tmp_path / "PWNED"
    planted = sweep / RECORD_DIR / "job_1.pkl"
    planted.write_bytes(_hostile_pickle(marker))

    res = run_app("app.py", *overrides, "hydra.launcher.resume=true", cwd=tmp_path)

    assert res.returncode == 1, res.output
    assert f"{planted}: carries no seal of this sweep" in res.output
    assert "resume=true refused" in res.output
    assert not marker.exists()
    # Job 0's genuine record is still this sweep's.
    assert read_record(sweep, 0, sweep_key_of(sweep)) is not None


def test_the_machine_key_is_the_user_s_alone(tmp_path: Path) -> None:
    from hydra_ray.core.seal import machine_key_path

    sweep_key_of(tmp_path / "sweep")
    path = machine_key_path()
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o077 == 0
    assert os.environ["XDG_STATE_HOME"] in str(path)  # the tests' own, not the user's


class _LogServer:
    """A dashboard's log API, as a hostile one answers: any file asked for is
    the crafted pack; what was asked is kept."""

    def __init__(self, pack: bytes) -> None:
        import http.server
        import threading

        asked: list[str] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                asked.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", str(len(pack)))
                self.end_headers()
                self.wfile.write(pack)

            def log_message(self, *args: Any) -> None:
                pass

        self.asked = asked
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_hostile_dashboard_s_pack_and_log_line_run_nothing_here(tmp_path: Path) -> None:
    """ray_jobs without a storage: the pack comes from the dashboard's log API.
    A dashboard (or whoever writes the Ray job's log) that serves a crafted
    pack, with a log line whose size and sha256 match it, gets it refused."""
    sweep = tmp_path / "sweep"
    book = _book(sweep)
    marker = tmp_path / "PWNED"
    pack = _crafted_pack(marker)
    server = _LogServer(pack)
    try:
        line = {
            "size": len(pack),
            "sha256": hashlib.sha256(pack).hexdigest(),
            "seal": "cd" * 32,
            "node_ip": "10.0.0.2",
            "cluster_sweep": "/home/ray/sweep",
            "node_id": "f" * 56,
            "file": "../../etc/evil.tar",
            "pack_path": "/",
        }
        where = jobs_api._pack_location(f"{PACK_MARK}{json.dumps(line)}\n")
        dashboard = Dashboard(server.address, {}, True)
        with pytest.raises(Unauthentic, match=r"sub-1\.tar from the dashboard at http"):
            jobs_api._bring_pack_home(dashboard, "sub-1", where, _sync_down(None), book, tmp_path)
        # The file asked for is this submission's pack, not the one the line names.
        assert len(server.asked) == 1 and "filename=sub-1.tar" in server.asked[0], server.asked
    finally:
        server.close()
    assert not marker.exists()
    assert not (sweep / RECORD_DIR / "job_0.pkl").exists()
