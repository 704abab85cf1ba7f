"""Installing the plugin as contributors and users do: `pip install -e .` (the
default editable mode) and a wheel both leave the launchers where Hydra's plugin
scan finds them."""

import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).parent.parent


@pytest.fixture(scope="module")
def hydra_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with Hydra (of the version under test) and without this plugin."""
    import hydra

    root = tmp_path_factory.mktemp("install") / "venv"
    venv.create(root, with_pip=True)
    pip = [str(root / "bin" / "python"), "-m", "pip", "install", "-q"]
    subprocess.run([*pip, f"hydra-core=={hydra.__version__}"], check=True)
    return root


def _checkout_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "checkout"
    copy.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, copy / name)
    for package in ("hydra_plugins", "hydra_ray"):
        shutil.copytree(
            REPO / package, copy / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copytree(REPO / "examples" / "simple", copy / "app")
    return copy


_WHERE = (
    "import importlib.util as u; "
    "print(*(u.find_spec(m).origin for m in "
    "('hydra_plugins.hydra_ray_launcher', 'hydra_ray.driver.head')))"
)


def _launcher_config(python: Path, app: Path) -> str:
    res = subprocess.run(
        [str(python), "my_app.py", "hydra/launcher=ray", "--cfg", "hydra", "-p", "hydra.launcher"],
        cwd=app,
        capture_output=True,
        text=True,
    )
    return res.stdout + res.stderr


@pytest.mark.parametrize("editable", [True, False], ids=["pip install -e .", "pip install ."])
def test_hydra_finds_the_launchers_after_pip_install(
    hydra_venv: Path, tmp_path: Path, editable: bool
) -> None:
    checkout = _checkout_copy(tmp_path)
    python = hydra_venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps"]
    install += ["-e", str(checkout)] if editable else [str(checkout)]
    try:
        subprocess.run(install, check=True, cwd=tmp_path)
        out = _launcher_config(python, checkout / "app")
        assert "_target_: hydra_plugins.hydra_ray_launcher.ray_launcher.RayLauncher" in out, out
        where = subprocess.run(
            [str(python), "-c", _WHERE],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        # The face and the implementation (its driver for clusters too), from the checkout or not.
        assert len(where) == 2, where
        assert [Path(w).is_relative_to(checkout) for w in where] == [editable] * 2, where
    finally:
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", "hydra-ray-launcher"], check=True
        )


def test_the_package_metadata_builds_without_warnings(hydra_venv: Path, tmp_path: Path) -> None:
    """A deprecated or invalid field (a license table, an unknown classifier) is
    a warning or an error at every build, and PyPI refuses unknown classifiers."""
    checkout = _checkout_copy(tmp_path)
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path), str(checkout)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    warnings = [ln for ln in res.stderr.splitlines() if "warn" in ln.lower()]
    # (pip's own notes on this machine's index locations are no build warnings)
    assert not [w for w in warnings if not w.startswith("WARNING: Location")], warnings
