"""Hydra launcher plugin that runs multirun sweeps on Ray."""

from ._config import __version__, register_configs

__all__ = ["__version__"]

# Hydra's plugin scan executes this package's __init__ each time it scans (also
# after its singletons were reset) but skips modules whose names start with "_".
register_configs()
