"""Version skew between this machine and the cluster, as users have it: a
KubeRay cluster runs the Ray of its image, often older than the laptop's. Here
a head started from a venv with the lowest Ray (and hydra-core, cloudpickle)
that pyproject.toml declares, swept with `ray_jobs` from this venv (the newest
Ray): every job's outputs and return value come home."""

import http.server
import importlib.util
import json
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest

from .conftest import APPS, free_port, ray_head, run_app
from .port_forward import port_forward
from .test_ray_jobs import sweep_to

REPO = Path(__file__).parent.parent
FRESH_SHELL = ("RAY_AUTH_MODE", "RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")


def _lowest_venv_script() -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(
        "lowest_venv", REPO / "scripts" / "lowest_venv.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LOWEST_VENV = _lowest_venv_script()


def lower_bounds() -> dict[str, str]:
    """The `>=` bound of each dependency in pyproject.toml, by distribution name."""
    bounds: dict[str, str] = LOWEST_VENV.lower_bounds()
    return bounds


@pytest.fixture(scope="module")
def lowest_ray_venv() -> Path:
    """A venv with this plugin (editable) and its dependencies at their declared
    lower bounds: the cluster's side (Ray, and what the driver needs) and the
    launcher's: ./.venv-lowest, as scripts/lowest_venv.py makes it (which
    scripts/test.sh may be doing beside the tests already: this waits for it)."""
    made = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "lowest_venv.py")],
        capture_output=True,
        text=True,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return Path(made.stdout.strip())


@pytest.fixture(scope="module")
def old_dashboard(lowest_ray_venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A head of the lowest declared Ray, its dashboard through a forwarded port."""
    home = tmp_path_factory.mktemp("old-head-home")
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    ours = str(Path(sys.executable).parent)
    env.update(
        HOME=str(home),
        PATH=os.pathsep.join(d for d in env["PATH"].split(os.pathsep) if d != ours),
    )
    port = free_port()
    with (
        ray_head(env, dashboard_port=port, ray_bin=lowest_ray_venv / "bin" / "ray"),
        port_forward(port) as forwarded,
    ):
        yield f"http://127.0.0.1:{forwarded}"


def test_a_cluster_on_the_lowest_declared_ray_runs_the_sweep_and_sends_everything_home(
    old_dashboard: str, lowest_ray_venv: Path, tmp_path: Path
) -> None:
    version = subprocess.run(
        [str(lowest_ray_venv / "bin" / "python"), "-c", "import ray; print(ray.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert version == lower_bounds()["ray"] or version.startswith(lower_bounds()["ray"] + ".")
    res = run_app(
        "app.py",
        "x=1,2,3",
        "returns=[a,{b: 2}]",
        "hydra/launcher=ray_jobs",
        f"hydra.launcher.address={old_dashboard}",
        "hydra.sweep.dir=sweep",
        cwd=tmp_path,
        env={"RAY_AUTH_MODE": "disabled"},
        unset=FRESH_SHELL[1:],
        timeout=300,
    )
    assert res.returncode == 0, res.output
    sweep = tmp_path / "sweep"
    for num in range(3):
        assert (sweep / str(num) / f"done_{num}.json").is_file(), res.output
        assert (sweep / str(num) / ".hydra" / "config.yaml").is_file(), res.output
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["status"] for j in summary["jobs"]] == ["succeeded"] * 3
    assert [j["return_value"] for j in summary["jobs"]] == ["a", {"b": 2}, 30]
    assert "did not come home" not in res.output


def test_the_lowest_ray_the_launcher_accepts_is_the_declared_one() -> None:
    from hydra_ray.core.wire import LOWEST_CLUSTER_RAY

    assert ".".join(map(str, LOWEST_CLUSTER_RAY)) == lower_bounds()["ray"]


class _OldDashboard(http.server.BaseHTTPRequestHandler):
    """Answers /api/version as a Ray 2.30 dashboard does; records every request."""

    requests: ClassVar[list[str]] = []

    def do_GET(self) -> None:
        self.requests.append(f"GET {self.path}")
        if self.path != "/api/version":
            self.send_error(404)
            return
        body = json.dumps({"version": "4", "ray_version": "2.30.0", "ray_commit": "x"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.requests.append(f"POST {self.path}")
        self.send_error(404)

    do_PUT = do_POST

    def log_message(self, *args: object) -> None:
        pass


def test_a_cluster_on_a_ray_older_than_declared_is_named_before_anything_is_uploaded(
    tmp_path: Path,
) -> None:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OldDashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    address = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        res = sweep_to(address, tmp_path)
    finally:
        server.shutdown()
        server.server_close()
    assert res.returncode != 0
    assert f"The cluster at {address} (hydra.launcher.address) runs Ray 2.30.0" in res.output
    assert f"needs Ray {lower_bounds()['ray']} or later" in res.output, res.output
    assert "Traceback" not in res.output, res.output
    assert not [r for r in _OldDashboard.requests if not r.startswith("GET /api/version")]


@pytest.fixture(scope="module")
def new_dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A head of this venv's (the newest) Ray, its dashboard through a forwarded port."""
    home = tmp_path_factory.mktemp("new-head-home")
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL}
    env.update(HOME=str(home), RAY_AUTH_MODE="disabled")
    port = free_port()
    with ray_head(env, dashboard_port=port), port_forward(port) as forwarded:
        yield f"http://127.0.0.1:{forwarded}"


@pytest.mark.parametrize(
    ("version", "older"),
    [
        ("2.39.9", True),
        ("1.13.0", True),
        ("2.40.0", False),
        ("2.40.0rc1", False),
        ("2.100.1", False),
        ("3.0.0", False),
        ("", False),
        ("dev", False),
    ],
)
def test_which_rays_are_older_than_the_lowest(version: str, older: bool) -> None:
    from hydra_ray.core.wire import older_than_lowest_ray

    assert older_than_lowest_ray(version) is older


def test_a_driver_on_a_ray_older_than_the_lowest_ends_at_once_naming_both(tmp_path: Path) -> None:
    """The driver as the cluster launchers and ray_jobs start it (`python -m
    hydra_ray.driver.head ...`), on a cluster whose Ray is older than the lowest
    (stood for by a `ray` package that says 2.39.0, first on its path: no such
    Ray installs here): it ends with exit 1 before it reads anything, and says
    which Ray and Python it found and which Ray it needs, without a traceback."""
    old = tmp_path / "old-ray"
    (old / "ray").mkdir(parents=True)
    (old / "ray" / "__init__.py").write_text('__version__ = "2.39.0"\n')
    path = os.pathsep.join(p for p in (str(old), os.environ.get("PYTHONPATH")) if p)
    res = subprocess.run(
        [sys.executable, "-m", "hydra_ray.driver.head", "job_spec.pkl", "returns.pkl"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"The cluster runs Ray 2.39.0 (in {sys.executable})" in res.stderr, res.stderr
    assert "needs Ray 2.40 or later on the cluster" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "driver.pid").exists()


def test_a_launcher_on_the_lowest_declared_versions_sweeps_a_cluster_on_the_newest_ray(
    lowest_ray_venv: Path, new_dashboard: str, tmp_path: Path
) -> None:
    """This plugin in the lowest-bounds venv (its Ray, hydra-core, cloudpickle,
    and rich at their declared lower bounds) against a head of the newest Ray."""
    python = lowest_ray_venv / "bin" / "python"
    bounds = lower_bounds()
    env = {k: v for k, v in os.environ.items() if k not in FRESH_SHELL and k != "PYTHONPATH"}
    res = subprocess.run(
        [
            str(python),
            str(APPS / "app.py"),
            "--multirun",
            "x=1,2",
            "hydra/launcher=ray_jobs",
            f"hydra.launcher.address={new_dashboard}",
            "hydra.sweep.dir=sweep",
        ],
        cwd=tmp_path,
        env={**env, "RAY_AUTH_MODE": "disabled"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout
    summary = json.loads((tmp_path / "sweep" / "sweep_summary.json").read_text())
    assert [j["return_value"] for j in summary["jobs"]] == [10, 20]
    for num in range(2):
        assert (tmp_path / "sweep" / str(num) / f"done_{num}.json").is_file(), res.stdout
    probe = "import ray, hydra, cloudpickle as c; print(ray.__version__, hydra.__version__)"
    versions = subprocess.run(
        [str(python), "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert versions[0].startswith(bounds["ray"]) and versions[1] == bounds["hydra-core"], versions
