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
"$VENV/bin/mypy" hydra_plugins tests
set +e
"$VENV/bin/python" -m pytest "$@"
status=$?
set -e
if [ $status -eq 5 ]; then
  echo "pytest collected no tests: that is a failure here" >&2
  exit 1
fi
exit $status
