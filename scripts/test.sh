#!/usr/bin/env bash
# Install everything the tests need (system packages too, when run as root), then
# lint, type-check and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
need=()
for tool in sshd:openssh-server rsync:rsync ip:iproute2 unshare:util-linux ps:procps; do
  command -v "${tool%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${tool%%:*}" ] || need+=("${tool#*:}")
done
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "not root: cannot install ${need[*]}; the cluster tests will be skipped" >&2
  fi
fi
EXTRAS="[test]" source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/mypy" hydra_plugins hydra_ray tests
set +e
"$VENV/bin/python" -m pytest "$@"
status=$?
set -e
if [ $status -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
if [ $status -ne 0 ] || [ $# -gt 0 ]; then
  exit $status
fi
# Users who install Hydra's official plugins get Hydra 1.4 pre-releases with
# OmegaConf 2.4: Hydra's conformance suites and the no-warnings test run there too.
# Those two packages go in a dir of their own, first on PYTHONPATH (the apps the
# tests start and Ray's workers inherit it), over the same venv: no second venv.
HYDRA14=$ROOT/.hydra14
rm -rf "$HYDRA14"
"$VENV/bin/pip" install -q --no-deps --target "$HYDRA14" "hydra-core==1.4.0rc3" "omegaconf==2.4.1rc1"
export PYTHONPATH="$HYDRA14${PYTHONPATH:+:$PYTHONPATH}"
"$VENV/bin/python" -c 'import hydra, omegaconf; print("Hydra", hydra.__version__, "OmegaConf", omegaconf.__version__)'
"$VENV/bin/python" -m pytest -p no:cacheprovider tests/test_conformance.py \
  tests/test_secrets.py tests/test_sweep_records.py tests/test_dry_run.py tests/test_tracebacks.py \
  tests/test_hydra_versions.py tests/test_snapshot.py tests/test_held.py tests/test_structure.py \
  "tests/test_ray_launcher.py::test_nothing_of_ours_warns_at_discovery_in_workers_or_per_job" \
  "tests/test_resources.py::test_each_job_gets_the_resources_its_own_config_asks_for" \
  "tests/test_resources.py::test_a_value_that_does_not_resolve_for_a_job_is_refused_before_ray_starts"
unset PYTHONPATH
rm -rf "$HYDRA14"
# The other Pythons that pyproject.toml declares: a smoke run on each (the example
# on a local Ray, a failing job, a resume, a ray_jobs round trip), in a venv of
# its own with the plugin and pytest only.
exec bash "$ROOT/scripts/smoke.sh"
