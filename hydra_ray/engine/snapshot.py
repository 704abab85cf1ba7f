"""The app's config sources, read once on the launching machine, for jobs that
run on machines without the app's config files.

The sweep state then carries every config of every source once, and each job
composes its own config where it runs, in parallel, as on one machine: no
config is composed per job here, and what crosses to the cluster does not grow
with the number of jobs. No Ray here.
"""

import copy
import functools
import os
import pickle
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hydra.core.object_type import ObjectType
from hydra.plugins.config_source import ConfigLoadError, ConfigResult, ConfigSource
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf

# Hydra lists neither of these as options of a group (nor does a snapshot).
_NOT_OPTIONS = ("__pycache__", "__init__.py")
# Dirs not read ahead into a snapshot: these, hidden ones (.hydra, .git, .venv),
# and Hydra's output dirs (they hold `.hydra` or `multirun.yaml`: the past sweeps
# of an app whose config_path is "."). Their yaml files are not the app's configs;
# read ahead, they made each sweep start slower and its state bigger, sweep after
# sweep. A job that names one reads it from the files, where they are.
_NOT_READ_AHEAD = ("site-packages", "node_modules")
# A config tree deeper than this has a link loop, not groups.
_MAX_DEPTH = 32


@dataclass(frozen=True)
class _Tree:
    """What one source holds: its groups and its configs (by path with the
    extension), or, for a config it could not read, what reading it raised."""

    available: bool
    groups: frozenset[str]
    configs: Mapping[str, ConfigResult]
    unreadable: Mapping[str, Exception]
    # Groups whose listing raised (Hydra 1.4 on a `.yml` file in it), with what.
    unlistable: Mapping[str, Exception]
    # Groups not read ahead (_not_read_ahead): what is in them is asked of the
    # original source, which finds the files where they are.
    skipped: frozenset[str] = frozenset()


class SnapshotConfigSource(ConfigSource):
    """Answers as the source it was read from did: the same provider, scheme
    and path (in Hydra's messages and each job's hydra.runtime.config_sources),
    the same groups and configs, each load a fresh copy."""

    def __init__(self, original: ConfigSource, tree: _Tree) -> None:
        self._scheme = original.scheme()
        self._tree = tree
        self._original = original
        super().__init__(original.provider, original.full_path())

    # An instance's scheme is its original's: not registered, never looked up by it.
    def scheme(self) -> str:  # type: ignore[override]
        return self._scheme

    def __deepcopy__(self, memo: dict[int, Any]) -> "SnapshotConfigSource":
        # Read only: Hydra copies the repository, with its sources, at every compose.
        return self

    def available(self) -> bool:
        return self._tree.available

    def is_group(self, config_path: str) -> bool:
        if self._skipped(config_path):
            return self._original.is_group(config_path)
        return _key(config_path) in self._tree.groups

    def is_config(self, config_path: str) -> bool:
        if self._skipped(config_path):
            return self._original.is_config(config_path)
        key = _key(self._normalize_file_name(config_path))
        return key in self._tree.configs or key in self._tree.unreadable

    def load_config(self, config_path: str) -> ConfigResult:
        if self._skipped(config_path):
            return self._original.load_config(config_path)
        key = _key(self._normalize_file_name(config_path))
        if key in self._tree.unreadable:
            raise copy.copy(self._tree.unreadable[key])
        if key not in self._tree.configs:
            raise ConfigLoadError(f"Config not found : {self.full_path()}/{key}")
        read = self._tree.configs[key]
        # Hydra changes what a load returns (defaults list, schema flag, merges).
        return ConfigResult(
            provider=read.provider,
            path=read.path,
            config=copy.deepcopy(read.config),
            header=dict(read.header),
        )

    def list(self, config_path: str, results_filter: ObjectType | None) -> list[str]:
        if self._skipped(config_path):
            # Where the files are not (another machine), as an empty group.
            if not self._original.is_group(config_path):
                return []
            return self._original.list(config_path, results_filter)
        parent = _key(config_path)
        if parent in self._tree.unlistable:
            raise copy.copy(self._tree.unlistable[parent])
        names: set[str] = set()
        if results_filter in (None, ObjectType.GROUP):
            names.update(
                os.path.basename(g) for g in self._tree.groups if g and _parent(g) == parent
            )
        if results_filter in (None, ObjectType.CONFIG):
            for path in (*self._tree.configs, *self._tree.unreadable):
                if _parent(path) == parent:
                    names.add(os.path.splitext(os.path.basename(path))[0])
        return sorted(n for n in names if n not in _NOT_OPTIONS)

    def _skipped(self, config_path: str) -> bool:
        # Asked at every look-up of every compose: the key's own prefixes, each a
        # set look-up, however many past sweeps were left out.
        parts = _key(config_path).split("/")
        skipped = self._tree.skipped
        return bool(skipped) and any(
            "/".join(parts[:n]) in skipped for n in range(1, len(parts) + 1)
        )


def _key(config_path: str) -> str:
    return config_path.strip("/")


def _parent(path: str) -> str:
    return path.rpartition("/")[0]


def _read(source: ConfigSource) -> _Tree:
    """Every group and config of `source`, as Hydra sees them through it.
    Quietly: Hydra's deprecation warnings (`.yml` files) are for the configs a
    job uses, and they come when it composes from the snapshot."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _read_all(source)


def _read_all(source: ConfigSource) -> _Tree:
    if not source.available():
        return _Tree(False, frozenset(), {}, {}, {})
    groups, configs, unreadable, unlistable = {""}, {}, {}, {}
    skipped: set[str] = set()
    todo = [""]
    while todo:
        group = todo.pop()
        depth = group.count("/") + 1 if group else 0
        if group and _not_read_ahead(source, group):
            skipped.add(group)
            continue
        try:
            subgroups = source.list(group, ObjectType.GROUP)
            names = source.list(group, ObjectType.CONFIG)
        except Exception as exc:  # whatever listing it raised: raised if a job lists it
            unlistable[group] = _portable(exc)
            continue
        for name in subgroups:
            path = f"{group}/{name}" if group else name
            if depth < _MAX_DEPTH and path not in groups:
                groups.add(path)
                todo.append(path)
        for name in names:
            path = f"{group}/{name}" if group else name
            # A name listed without its extension: x.yaml, or x.yml (Hydra < 1.2 reads
            # those when named with it).
            if not source.is_config(path) and _is_config(source, f"{path}.yml"):
                path += ".yml"
            key = _key(source._normalize_file_name(path))
            try:
                configs[key] = source.load_config(path)
            except Exception as exc:  # whatever reading it raised: raised if a job uses it
                unreadable[key] = _portable(exc)
    return _Tree(True, frozenset(groups), configs, unreadable, unlistable, frozenset(skipped))


def _not_read_ahead(source: ConfigSource, group: str) -> bool:
    """Whether `group` is a dir that holds no configs of the app's own (two
    look-ups, not a listing: a sweep dir holds a dir per job)."""
    name = group.rpartition("/")[2]
    return (
        name.startswith(".")
        or name in _NOT_READ_AHEAD
        or source.is_group(f"{group}/.hydra")
        or _is_config(source, f"{group}/multirun")
    )


def _portable(exc: Exception) -> Exception:
    """`exc`, or its words in a ConfigLoadError if it does not pickle."""
    exc = exc.with_traceback(None)
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:  # whatever its own pickling raises
        return ConfigLoadError(f"{type(exc).__name__}: {exc}")
    return exc


def _is_config(source: ConfigSource, path: str) -> bool:
    try:
        return source.is_config(path)
    except ConfigLoadError:  # Hydra 1.4 refuses the extension
        return False


def why_not_portable(config: DictConfig, job_overrides: Sequence[Sequence[str]]) -> str | None:
    """Why the jobs' configs cannot be composed from a snapshot where they run
    (they are then composed here, as before); None if they can."""
    if OmegaConf.select(config, "hydra.searchpath"):
        # Hydra builds the sources of hydra.searchpath anew at each compose.
        return "hydra.searchpath is set"
    if OmegaConf.select(config, "hydra.job.env_copy"):
        # Composing copies these from the environment of the process that composes.
        return "hydra.job.env_copy is set"
    for overrides in job_overrides:
        if any(o.lstrip("+~").startswith("hydra.searchpath") for o in overrides):
            return "a job overrides hydra.searchpath"
    return None


def portable_context(hydra_context: HydraContext) -> HydraContext:
    """A copy of `hydra_context` whose config loader reads every config from a
    snapshot of this machine's sources. Structured sources read the ConfigStore,
    which travels with Hydra's singletons: they stay, shared by every compose."""
    loader = copy.deepcopy(hydra_context.config_loader)
    sources = loader.get_sources()
    for n, source in enumerate(sources):
        if source.scheme() == "structured":
            # Hydra copies each source at every compose, this one with the whole
            # ConfigStore (9 ms a job here); it only reads the store, whose loads copy.
            source.__deepcopy__ = functools.partial(_itself, source)  # type: ignore[attr-defined]
        else:
            sources[n] = SnapshotConfigSource(source, _read(source))
    return HydraContext(config_loader=loader, callbacks=hydra_context.callbacks)


def _itself(source: ConfigSource, memo: dict[int, Any]) -> ConfigSource:
    return source
