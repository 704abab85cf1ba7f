# Sourced by the scripts beside it: make ./.venv (once) with the plugin installed.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-python3}

"$PYTHON" - <<'PY' || { echo "Python >= 3.10 is needed (set PYTHON=...)" >&2; exit 1; }
import sys
sys.exit(sys.version_info < (3, 10))
PY
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
fi
"$VENV/bin/pip" install -q -e "$ROOT${EXTRAS:-}"
