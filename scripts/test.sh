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
HYDRA14=$ROOT/.hydra14
prepare_later_stages() {
  # The installs the Hydra 1.4 and smoke stages need (the network, no Ray), made
  # beside the lint and the lanes, not after them.
  rm -rf "$HYDRA14"
  "$VENV/bin/pip" install -q --no-deps --target "$HYDRA14" "hydra-core==1.4.0rc3" "omegaconf==2.4.1rc1"
  bash "$ROOT/scripts/smoke.sh" --prepare
}
PREP_PID=
if [ $# -eq 0 ]; then
  PREP_LOG=$(mktemp "${TMPDIR:-/tmp}/hydra-ray-prepare.XXXXXX")
  prepare_later_stages >"$PREP_LOG" 2>&1 &
  PREP_PID=$!
  trap 'kill "$PREP_PID" 2>/dev/null; exit 130' INT TERM
fi
"$VENV/bin/ruff" check .
"$VENV/bin/mypy" hydra_plugins hydra_ray tests
if [ $# -gt 0 ]; then
  set +e
  "$VENV/bin/python" -m pytest "$@"
  status=$?
  set -e
  [ $status -ne 5 ] || { echo "pytest collected no tests: that is a failure here" >&2; exit 1; }
  exit $status
fi
# The whole suite runs in two lanes at once. The fake-hosts lane (tests/cluster)
# runs its Rays, sshds and launchers in network namespaces of its own and spends
# most of its time waiting on ssh and Ray's autoscaler; it runs beside everything
# else (every other test shares this machine's loopback ports and one session
# Ray, and stays in one lane, in order). Its output follows once it is done.
LANE_LOG=$(mktemp "${TMPDIR:-/tmp}/hydra-ray-fake-hosts-lane.XXXXXX")
"$VENV/bin/python" -m pytest -p no:cacheprovider tests/cluster >"$LANE_LOG" 2>&1 &
LANE_PID=$!
lane_done() {
  # The fake-hosts lane's status; its output, with a header, once it has ended.
  local lane_status=0
  wait "$LANE_PID" || lane_status=$?
  echo "================ the fake-hosts lane (tests/cluster), run beside the above ================"
  cat "$LANE_LOG"
  rm -f "$LANE_LOG"
  return $lane_status
}
# Ctrl-C: the lane too, its fake hosts taken down by its own fixtures, then stop.
trap 'kill "$PREP_PID" 2>/dev/null; kill -INT "$LANE_PID" 2>/dev/null; wait "$LANE_PID"; exit 130' INT TERM
failed=()
run_stage() {
  # Run a stage (a command); record its name when it fails, and go on.
  local name=$1
  shift
  local stage_status=0
  "$@" || stage_status=$?
  if [ $stage_status -eq 5 ]; then
    echo "pytest collected no tests in stage '$name': that is a failure here" >&2
  fi
  [ $stage_status -eq 0 ] || failed+=("$name (exit $stage_status)")
}
run_stage "this-host lane" "$VENV/bin/python" -m pytest --ignore=tests/cluster
# Users who install Hydra's official plugins get Hydra 1.4 pre-releases with
# OmegaConf 2.4: Hydra's conformance suites and the no-warnings test run there too.
# Those two packages go in a dir of their own, first on PYTHONPATH (the apps the
# tests start and Ray's workers inherit it), over the same venv: no second venv.
prepared=0
if wait "$PREP_PID"; then
  prepared=1
else
  failed+=("preparing the Hydra 1.4 and smoke venvs")
fi
echo "================ the Hydra 1.4 and smoke venvs, made beside the above ================"
cat "$PREP_LOG"
rm -f "$PREP_LOG"
hydra14() {
  PYTHONPATH="$HYDRA14${PYTHONPATH:+:$PYTHONPATH}" "$@"
}
hydra14 "$VENV/bin/python" -c 'import hydra, omegaconf; print("Hydra", hydra.__version__, "OmegaConf", omegaconf.__version__)'
run_stage "Hydra 1.4" hydra14 "$VENV/bin/python" -m pytest -p no:cacheprovider tests/test_conformance.py \
  tests/test_secrets.py tests/test_sweep_records.py tests/test_dry_run.py tests/test_tracebacks.py \
  tests/test_hydra_versions.py tests/test_snapshot.py tests/test_held.py tests/test_structure.py \
  "tests/test_ray_launcher.py::test_nothing_of_ours_warns_at_discovery_in_workers_or_per_job" \
  "tests/test_real_code.py::test_a_job_runs_as_its_script_would_on_a_local_ray" \
  "tests/test_real_code.py::test_a_script_is_made_the_jobs_main_and_put_back_after" \
  "tests/test_resources.py::test_each_job_gets_the_resources_its_own_config_asks_for" \
  "tests/test_resources.py::test_a_value_that_does_not_resolve_for_a_job_is_refused_before_ray_starts"
rm -rf "$HYDRA14"
# The other Pythons that pyproject.toml declares: a smoke run on each (the example
# on a local Ray, a failing job, a resume, a ray_jobs round trip), in a venv of
# its own with the plugin and pytest only.
export SMOKE_PREPARED=$prepared
run_stage "smoke" bash "$ROOT/scripts/smoke.sh"
run_stage "fake-hosts lane" lane_done
trap - INT TERM
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}" >&2
  exit 1
fi
echo "All stages passed."
