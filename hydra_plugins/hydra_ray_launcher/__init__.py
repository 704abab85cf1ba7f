"""Hydra launcher plugin that runs multirun sweeps on Ray: the Hydra face (the
config dataclasses, the launchers); the implementation is the `hydra_ray` package.

Modules of versions before 2.0.0.dev1 lived here (`_jobs`, `_held`, ...), and
pickles name their classes by those paths: a job's record, a JobReturn a user or
a sweeper saved. `_OldPaths` maps each old module to where its names are now,
when something imports it, so those pickles still load.
"""

import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import types
import warnings
from collections.abc import Sequence
from typing import Any

from ._config import __version__, register_configs

__all__ = ["__version__"]

# Each old module, and the modules that hold its names now (searched in order).
_MOVED = {
    "_errors": ("hydra_ray.core.errors",),
    "_held": ("hydra_ray.core.held",),
    "_redact": ("hydra_ray.core.redact",),
    "_tracebacks": ("hydra_ray.core.tracebacks",),
    "_digest": ("hydra_ray.core.digest",),
    "_records": ("hydra_ray.core.records",),
    "_jobs": ("hydra_ray.core.jobs", "hydra_ray.engine.worker", "hydra_ray.core.errors"),
    "_validate": ("hydra_ray.checks.validate",),
    "_resources": ("hydra_ray.checks.resources",),
    "_connect": ("hydra_ray.infra.connect",),
    "_cluster": ("hydra_ray.infra.autoscaler",),
    "_sync": ("hydra_ray.infra.sync",),
    "_storage": ("hydra_ray.infra.storage",),
    "_scratch": ("hydra_ray.infra.scratch",),
    "_procs": ("hydra_ray.infra.procs",),
    "_snapshot": ("hydra_ray.engine.snapshot",),
    "_gather": ("hydra_ray.engine.gather",),
    "_report": ("hydra_ray.engine.report",),
    "_engine": ("hydra_ray.engine.run",),
    "_head_driver": ("hydra_ray.driver.protocol", "hydra_ray.driver.head"),
    "_sweep": ("hydra_ray.launch.sweep",),
    "_plan": ("hydra_ray.launch.plan",),
    "_launch": ("hydra_ray.launch.skeleton",),
    "_local": ("hydra_ray.launch.local",),
    "_remote": ("hydra_ray.launch.cluster",),
    "_jobs_api": ("hydra_ray.launch.jobs_api",),
}


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


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports `hydra_plugins.hydra_ray_launcher._jobs` and the like as a module
    whose attributes are looked up, when read, in the modules that hold them now.
    Nothing is imported until an old path is."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        package, _, name = fullname.rpartition(".")
        if package != __name__ or name not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        homes = _MOVED[spec.name.rpartition(".")[2]]

        def __getattr__(attr: str) -> Any:
            for home in homes:
                found = importlib.import_module(home)
                if hasattr(found, attr):
                    return getattr(found, attr)
            raise AttributeError(f"module {spec.name!r} has no attribute {attr!r}")

        module.__getattr__ = __getattr__  # type: ignore[method-assign]
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# Hydra's plugin scan executes this package's __init__ each time it scans (also
# after its singletons were reset): one finder, whatever the count.
if not any(type(finder).__name__ == "_OldPaths" for finder in sys.meta_path):
    sys.meta_path.append(_OldPaths())
    _warn_of_old_plugin_files()  # once per process, as the finder
register_configs()
