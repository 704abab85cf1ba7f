#!/usr/bin/env bash
# A smoke run of the plugin on each Python that pyproject.toml declares besides
# the main venv's: the example sweep on a local Ray, a failing job among good
# ones, a resume, a ray_jobs round trip with outputs home, jobs that run as their
# script would (its __main__, pools, a relaunch). Each Python gets its
# own venv (./.venv-py3.X) with the plugin (editable) and pytest only; then the
# same on the main Python with every dependency at its declared lower bound
# (./.venv-lowest, made by scripts/lowest_venv.py, shared with
# tests/test_ray_versions.py).
# Interpreters are found as python3.X on PATH or in pyenv; one that is absent is
# named and skipped. Usage: scripts/smoke.sh [--prepare] [3.10 3.12 ...]
# --prepare: make the venvs only, run nothing (scripts/test.sh does it beside the
# other tests, which need no network; SMOKE_PREPARED=1 then skips the installs).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$ROOT"
PREPARE=0
if [ "${1:-}" = --prepare ]; then
  PREPARE=1
  shift
fi
VERSIONS=("$@")
[ ${#VERSIONS[@]} -gt 0 ] || VERSIONS=(3.10 3.12 3.13)
TESTS=(
  "tests/test_ray_launcher.py::test_example_simple_runs_on_local_ray"
  "tests/test_ray_launcher.py::test_failed_and_killed_jobs_do_not_stop_the_others"
  "tests/test_long_sweeps.py::test_an_interrupted_sweep_resumes_without_running_finished_jobs_again"
  "tests/test_ray_jobs.py::test_a_sweep_runs_as_one_ray_job_and_everything_comes_home"
  "tests/test_real_code.py::test_a_job_runs_as_its_script_would_on_a_local_ray"
  "tests/test_real_code.py::test_a_job_that_starts_and_ends_a_fork_pool_again_and_again_never_hangs"
  "tests/test_untar.py"
)

find_python() {
  # pyenv's own versions first: its shim python3.X on PATH exists even where
  # that version is not selected, and then fails when run.
  local version=$1 found root=${PYENV_ROOT:-$HOME/.pyenv}
  command -v pyenv >/dev/null 2>&1 && root=$(pyenv root)
  for found in $(ls -d "$root"/versions/"$version".*/bin/"python$version" 2>/dev/null | sort -Vr) \
    "$(command -v "python$version" 2>/dev/null)"; do
    if [ -n "$found" ] && "$found" -c pass >/dev/null 2>&1; then
      echo "$found"
      return 0
    fi
  done
  return 1
}

skipped=()
for version in "${VERSIONS[@]}"; do
  if ! python=$(find_python "$version"); then
    echo "Python $version: no python$version on PATH or in pyenv; its smoke run is SKIPPED" >&2
    skipped+=("$version")
    continue
  fi
  venv=$ROOT/.venv-py$version
  if [ "${SMOKE_PREPARED:-0}" != 1 ]; then
    if [ ! -x "$venv/bin/python" ]; then
      "$python" -m venv "$venv"
      "$venv/bin/pip" install -q --upgrade pip
    fi
    "$venv/bin/pip" install -q -e "$ROOT" "pytest>=8"
  fi
  [ $PREPARE = 0 ] || continue
  "$venv/bin/python" -c 'import sys, ray, hydra; print("Python", sys.version.split()[0], "Ray", ray.__version__, "Hydra", hydra.__version__)'
  "$venv/bin/python" -m pytest -p no:cacheprovider "${TESTS[@]}"
done
# The declared lower bounds of ray, hydra-core, cloudpickle and rich (pyproject.toml's
# ">=" of each), on the main venv's Python: the same smoke run in ./.venv-lowest.
venv=$("$ROOT/.venv/bin/python" "$ROOT/scripts/lowest_venv.py")
[ $PREPARE = 0 ] || exit 0
"$venv/bin/python" -c 'import sys, ray, hydra, cloudpickle, rich; from importlib.metadata import version; print("Lower bounds: Python", sys.version.split()[0], "Ray", ray.__version__, "Hydra", hydra.__version__, "cloudpickle", cloudpickle.__version__, "rich", version("rich"))'
"$venv/bin/python" -m pytest -p no:cacheprovider "${TESTS[@]}"
if [ ${#skipped[@]} -gt 0 ]; then
  echo "Smoke runs SKIPPED for Python ${skipped[*]} (not on this machine)" >&2
fi
