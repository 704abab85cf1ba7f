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
prepared() {
  # Wait for the installs; true if they all succeeded.
  while [ ! -s "$RUN_DIR/prepare.status" ] && kill -0 "$PREP_PID" 2>/dev/null; do
    sleep 2
  done
  [ "$(cat "$RUN_DIR/prepare.status" 2>/dev/null)" = 0 ]
}
PREP_PID=
if [ $# -eq 0 ]; then
  # The stages' logs and statuses, for the ones run in the background.
  RUN_DIR=$(mktemp -d "${TMPDIR:-/tmp}/hydra-ray-test-run.XXXXXX")
  (
    status=0
    prepare_later_stages >"$RUN_DIR/prepare.log" 2>&1 || status=$?
    echo $status >"$RUN_DIR/prepare.status"
  ) &
  PREP_PID=$!
  trap 'kill "$PREP_PID" 2>/dev/null; rm -rf "$RUN_DIR"; exit 130' INT TERM
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
# Ray, and stays in one lane, in order). Then, where this script may make a
# network namespace (root), the smoke stage follows in that lane, on a loopback
# of its own (its Rays' ports are then its own too), beside the end of the first
# lane and the Hydra 1.4 stage. The lane's output follows once it is done.
OWN_NETNS=0
if unshare --net true 2>/dev/null && command -v ip >/dev/null 2>&1; then
  OWN_NETNS=1
  SMOKE_RAY_TMP=$(mktemp -d /tmp/hrs.XXXXXX)
fi
in_own_netns() {
  # Its own loopback, and its own Ray temp dir (RAY_TMPDIR): no Ray of the
  # other stages finds its Rays in /tmp/ray (ray_current_cluster), nor it theirs.
  # (Short: Ray's socket paths there must stay under 108 bytes.)
  RAY_TMPDIR=$SMOKE_RAY_TMP unshare --net sh -c 'ip link set lo up && exec "$@"' in-own-netns "$@"
}
second_lane() {
  local status=0
  "$VENV/bin/python" -m pytest -p no:cacheprovider tests/cluster >"$RUN_DIR/fake-hosts.log" 2>&1 \
    || status=$?
  echo $status >"$RUN_DIR/fake-hosts.status"
  [ $OWN_NETNS = 1 ] || return 0
  status=0
  if prepared; then
    export SMOKE_PREPARED=1
  fi
  in_own_netns bash "$ROOT/scripts/smoke.sh" >"$RUN_DIR/smoke.log" 2>&1 || status=$?
  echo $status >"$RUN_DIR/smoke.status"
}
second_lane &
LANE_PID=$!
descendants() {
  local child
  for child in $(ps -o pid= --ppid "$1"); do
    echo "$child"
    descendants "$child"
  done
}
stop_second_lane() {
  # Ctrl-C: the pytest that runs in the second lane too (its fixtures take the
  # fake hosts and Rays down), then stop.
  kill "$PREP_PID" 2>/dev/null
  local pid
  for pid in $(descendants "$LANE_PID"); do
    if ps -o args= -p "$pid" | grep -q -- "-m pytest"; then
      kill -INT "$pid" 2>/dev/null
    fi
  done
  wait "$LANE_PID"
  rm -rf "$RUN_DIR" "${SMOKE_RAY_TMP:-}"
  exit 130
}
trap stop_second_lane INT TERM
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
from_second_lane() {
  # A stage run in the second lane: its output, under a header, and its status.
  local name=$1 part=$2
  echo "================ $name, run in the second lane beside the above ================"
  cat "$RUN_DIR/$part.log"
  return "$(cat "$RUN_DIR/$part.status" 2>/dev/null || echo 1)"
}
run_stage "this-host lane" "$VENV/bin/python" -m pytest --ignore=tests/cluster
# Users who install Hydra's official plugins get Hydra 1.4 pre-releases with
# OmegaConf 2.4: Hydra's conformance suites and the no-warnings test run there too.
# Those two packages go in a dir of their own, first on PYTHONPATH (the apps the
# tests start and Ray's workers inherit it), over the same venv: no second venv.
wait "$PREP_PID" || true
prep_ok=1
prepared || {
  prep_ok=0
  failed+=("preparing the Hydra 1.4 and smoke venvs")
}
echo "================ the Hydra 1.4 and smoke venvs, made beside the above ================"
cat "$RUN_DIR/prepare.log"
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
# its own with the plugin and pytest only: here, unless the second lane runs it.
if [ $OWN_NETNS = 0 ]; then
  export SMOKE_PREPARED=$prep_ok
  run_stage "smoke" bash "$ROOT/scripts/smoke.sh"
fi
wait "$LANE_PID" || true
run_stage "fake-hosts lane" from_second_lane "the fake-hosts lane (tests/cluster)" fake-hosts
if [ $OWN_NETNS = 1 ]; then
  run_stage "smoke" from_second_lane "the smoke stage, on a loopback of its own" smoke
fi
rm -rf "$RUN_DIR" "${SMOKE_RAY_TMP:-}"
trap - INT TERM
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED stages: ${failed[*]}" >&2
  exit 1
fi
echo "All stages passed."
