#!/usr/bin/env bash
# Set up ./.venv and run the example sweep on an embedded local Ray: 3 jobs in parallel.
source "$(dirname "${BASH_SOURCE[0]}")/_venv.sh"
cd "$ROOT/examples/simple"
exec "$VENV/bin/python" my_app.py --multirun task=1,2,3 hydra/launcher=ray "$@"
