"""Hydra launcher plugin that runs multirun sweeps on Ray."""

from ._config import register_configs

__version__ = "2.0.0.dev0"

# Hydra's plugin scan executes this package's __init__ each time it scans (also
# after its singletons were reset) but skips modules whose names start with "_".
register_configs()
