"""Make ./.venv-lowest: this plugin (editable) with every dependency at the `>=`
bound pyproject.toml declares for it (Ray with its `default` extra, which a
head's dashboard needs), on the Python that runs this script. Kept for the next
run when made for the same bounds. Prints the venv's path.

scripts/smoke.sh (its lower-bounds run, and its preparation beside the tests)
and tests/test_ray_versions.py both use it; a lock lets one make it while the
other waits, never both at once."""

import fcntl
import hashlib
import json
import re
import subprocess
import sys
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / ".venv-lowest"


def lower_bounds() -> dict[str, str]:
    """The `>=` bound of each dependency in pyproject.toml, by distribution name."""
    text = (REPO / "pyproject.toml").read_text()
    listed = re.search(r"^dependencies = \[(.*?)^\]", text, re.MULTILINE | re.DOTALL)
    if listed is None:
        raise SystemExit("no dependencies list in pyproject.toml")
    bounds = {}
    for spec in re.findall(r'"([^"]+)"', listed.group(1)):
        found = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?\s*>=\s*([0-9.]+)", spec)
        if found is None:
            raise SystemExit(f"no lower bound in {spec!r} (pyproject.toml)")
        bounds[found.group(1)] = found.group(3)
    return bounds


def wanted() -> list[str]:
    return [
        f"{name}[default]=={bound}" if name == "ray" else f"{name}=={bound}"
        for name, bound in lower_bounds().items()
    ]


def make() -> Path:
    """The venv, made (or made again) unless its stamp names the same bounds
    and the same pyproject.toml (the editable install's metadata)."""
    pins = [*wanted(), "pytest>=8"]
    project = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    made_for = {"pins": pins, "pyproject.toml": project}
    stamp = ROOT / "hydra-ray-bounds.json"
    with open(REPO / ".venv-lowest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.is_file() and json.loads(stamp.read_text()) == made_for:
            return ROOT
        venv.create(ROOT, with_pip=True, clear=True)
        pip = [str(ROOT / "bin" / "python"), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, "-e", str(REPO), *pins], check=True, stdout=sys.stderr)
        stamp.write_text(json.dumps(made_for))
    return ROOT


if __name__ == "__main__":
    print(make())
