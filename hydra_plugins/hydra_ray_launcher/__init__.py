"""Hydra launcher plugin that runs multirun sweeps on Ray: the Hydra face (the
config dataclasses, the launchers); the implementation is the `hydra_ray` package.

Importing this package registers the launchers' configs in Hydra's ConfigStore
and warns, once per process, of files of the 1.x plugin left on the path.
"""

import os
import sys
import warnings

from ._config import __version__, register_configs

__all__ = ["__version__"]


# Modules of the 1.x hydra-ray-launcher plugin (facebookresearch/hydra's, the same
# distribution name and package path) that this one does not have: left beside
# ours, Hydra's plugin scan imports them as part of this plugin.
_OLD_PLUGIN_FILES = (
    "_core.py",
    "_core_aws.py",
    "_core_autoscaler.py",
    "_core_local.py",
    "_launcher_util.py",
    "_remote_invoke.py",
    "_config_auth.py",
    "_config_cluster.py",
    "_config_node_type.py",
    "_config_provider.py",
    "ray_local_launcher.py",
    "ray_autoscaler_launcher.py",
    "ray_remote_invoke.py",
    "conf",
)


def _old_plugin_files() -> list[str]:
    """Files of the 1.x plugin in this package's dir, or in another copy of the
    package on the path (a 1.x install that an editable checkout or PYTHONPATH
    shadows): a few stats, cheap at every start."""
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [here]
    plugins = sys.modules.get("hydra_plugins")
    for entry in getattr(plugins, "__path__", []):
        other = os.path.join(os.path.abspath(entry), "hydra_ray_launcher")
        if other not in dirs and os.path.isdir(other):
            dirs.append(other)
    found = [os.path.join(d, name) for d in dirs for name in _OLD_PLUGIN_FILES]
    return [path for path in found if os.path.exists(path)]


def _warn_of_old_plugin_files() -> None:
    found = _old_plugin_files()
    if found:
        warnings.warn(
            f"hydra-ray-launcher {__version__}: files of the 1.x hydra-ray-launcher plugin "
            f"are on the path with this one: {', '.join(found)}. Hydra may load them "
            "instead of this plugin, or with it. Remove them: 'pip uninstall "
            "hydra-ray-launcher' (until pip finds none), delete those files if any are "
            "left, then install this one again.",
            UserWarning,
            stacklevel=1,
        )


# Hydra's plugin scan executes this package's __init__ each time it scans (also
# after its singletons were reset): again in the module imported, or, at a first
# scan, in a new module whose `from ._config` imports the package once more. The
# module in sys.modules tells whether one has warned: once per process.
if not getattr(sys.modules.get(__name__), "_warned_of_old_plugin_files", False):
    _warn_of_old_plugin_files()
_warned_of_old_plugin_files = True
register_configs()
