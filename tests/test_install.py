"""Installing the plugin as contributors and users do: `pip install -e .` (the
default editable mode) and a wheel both leave the launchers where Hydra's plugin
scan finds them."""

import os
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


def _site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


PLUGIN = "hydra_plugins.hydra_ray_launcher"
_PRINT_LAUNCHER = ("my_app.py", "hydra/launcher=ray", "--cfg", "hydra", "-p", "hydra.launcher")


def test_installing_over_the_1x_plugin_replaces_it(hydra_venv: Path, tmp_path: Path) -> None:
    """The package index's hydra-ray-launcher (1.2.2, the plugin this one
    replaces) has the same distribution name and package path: pip uninstalls
    it when it installs this one, and no file of it is left for Hydra to scan."""
    python = hydra_venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "--no-deps"]
    plugin_dir = _site_packages(python) / "hydra_plugins" / "hydra_ray_launcher"
    try:
        subprocess.run([*pip, "hydra-ray-launcher==1.2.2"], check=True, cwd=tmp_path)
        assert (plugin_dir / "_core_aws.py").is_file()  # the 1.x plugin is there
        subprocess.run([*pip, str(_checkout_copy(tmp_path))], check=True, cwd=tmp_path)
        assert not (plugin_dir / "_core_aws.py").exists()
        assert not (plugin_dir / "_launcher_util.py").exists()
        version = subprocess.run(
            [
                str(python),
                "-c",
                "import hydra_plugins.hydra_ray_launcher as p; print(p.__version__)",
            ],
            capture_output=True,
            text=True,
            check=True,
            cwd=tmp_path,
        )
        assert version.stdout.strip().startswith("2."), version.stdout
        assert not version.stderr, version.stderr  # nothing left to warn of
    finally:
        subprocess.run(
            [str(python), "-m", "pip", "uninstall", "-q", "-y", "hydra-ray-launcher"], check=True
        )


def _print_launcher(app: Path, env: dict[str, str]) -> "subprocess.CompletedProcess[str]":
    """The app's launcher config, printed by Hydra, with this Python and `env`."""
    return subprocess.run(
        [sys.executable, *_PRINT_LAUNCHER], cwd=app, env=env, capture_output=True, text=True
    )


def test_files_of_the_1x_plugin_beside_this_one_are_named_once(tmp_path: Path) -> None:
    """A 1.x module left in the plugin's dir (a copy over an old install, a
    half-done uninstall) and another copy of the package that this one shadows
    on the path: one warning at the sweep's start names both, with the fix."""
    checkout = _checkout_copy(tmp_path)
    left = checkout / "hydra_plugins" / "hydra_ray_launcher" / "_core_aws.py"
    left.write_text("# a module of hydra-ray-launcher 1.2.2\n")
    shadowed = tmp_path / "old" / "hydra_plugins" / "hydra_ray_launcher"
    shadowed.mkdir(parents=True)
    (shadowed / "__init__.py").write_text('__version__ = "1.2.2"\n')
    (shadowed / "_launcher_util.py").write_text("# a module of hydra-ray-launcher 1.2.2\n")
    env = dict(os.environ, PYTHONPATH=f"{checkout}{os.pathsep}{tmp_path / 'old'}")
    res = _print_launcher(checkout / "app", env)
    assert res.returncode == 0, res.stderr
    assert "RayLauncher" in res.stdout, res.stdout
    warned = [ln for ln in res.stderr.splitlines() if "files of the 1.x" in ln]
    assert len(warned) == 1, res.stderr
    assert str(left) in warned[0], warned
    assert str(shadowed / "_launcher_util.py") in warned[0], warned
    assert "pip uninstall hydra-ray-launcher" in warned[0], warned
    # Without them: not a word.
    left.unlink()
    env["PYTHONPATH"] = str(checkout)
    clean = _print_launcher(checkout / "app", env)
    assert clean.returncode == 0 and "files of the 1.x" not in clean.stderr, clean.stderr


def test_the_wheel_and_sdist_pass_twine_check_and_the_wheel_alone_runs_a_sweep(
    tmp_path: Path,
) -> None:
    """What a release would upload: `python -m build` makes a wheel and an
    sdist that `twine check --strict` passes (the README renders on the index);
    the wheel, installed with its dependencies into a clean venv, runs the
    example sweep on a local Ray of its own, from the venv and not a checkout."""
    checkout = _checkout_copy(tmp_path)
    dist = tmp_path / "dist"
    built = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(dist), str(checkout)],
        capture_output=True,
        text=True,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    wheels, sdists = sorted(dist.glob("*.whl")), sorted(dist.glob("*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", str(wheels[0]), str(sdists[0])],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count("PASSED") == 2, checked.stdout

    root = tmp_path / "venv"
    venv.create(root, with_pip=True)
    python = root / "bin" / "python"
    subprocess.run([str(python), "-m", "pip", "install", "-q", str(wheels[0])], check=True)
    app = tmp_path / "app"
    shutil.copytree(REPO / "examples" / "simple", app)
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "PYTHON"))}
    res = subprocess.run(
        [
            str(python),
            "my_app.py",
            "--multirun",
            "task=1,2",
            "hydra/launcher=ray",
            f"hydra.sweep.dir={sweep}",
            "hydra.launcher.ray.init.address=local",
            "hydra.launcher.ray.init.num_cpus=1",
            "hydra.launcher.ray.init.include_dashboard=false",
        ],
        cwd=app,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for num in range(2):
        assert f"Executing task {num + 1}" in (sweep / str(num) / "my_app.log").read_text()
    where = subprocess.run(
        [str(python), "-c", _WHERE], cwd=tmp_path, capture_output=True, text=True, check=True
    ).stdout.split()
    assert all(Path(w).is_relative_to(root) for w in where), where
