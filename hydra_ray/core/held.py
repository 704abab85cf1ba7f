"""A finished job's `JobReturn` as the launching process holds it: its configs
kept pickled until something reads them.

Hydra's `Launcher.launch` returns the JobReturns of the whole batch, and its
sweepers keep every batch's; as DictConfigs a job's `cfg` and `hydra_cfg` take
~100 KiB of memory and ~900 objects the garbage collector walks, pickled ~20 KB
and one object. Sweepers read `return_value`; the configs are unpickled on
first read, and kept from then on.
"""

from typing import Any

import cloudpickle
from hydra.core.utils import JobReturn
from omegaconf import DictConfig, OmegaConf

from hydra_ray.core.redact import redacted_hydra_config


class _Pickled(bytes):
    """A config not unpickled yet."""


def _loaded(self: "HeldJobReturn", name: str) -> Any:
    value = self.__dict__.get(name)
    if isinstance(value, _Pickled):
        value = self.__dict__[name] = cloudpickle.loads(value)
    return value


def _config(name: str) -> Any:
    def setter(self: "HeldJobReturn", value: DictConfig | None) -> None:
        self.__dict__[name] = value

    return property(lambda self: _loaded(self, name), setter)


class HeldJobReturn(JobReturn):
    """A JobReturn whose `cfg` and `hydra_cfg` are unpickled when first read.
    Its `hydra_cfg` has the launcher's secrets hidden (as in the job's record,
    which a resume returns), and its `output_dir` says where the job wrote
    without unpickling it."""

    cfg = _config("cfg")
    hydra_cfg = _config("hydra_cfg")
    output_dir: str | None = None

    def pickled(self, name: str) -> bool:
        """Whether config `name` ("cfg" or "hydra_cfg") is still pickled, as held."""
        return isinstance(self.__dict__.get(name), _Pickled)


def hold(ret: JobReturn) -> HeldJobReturn:
    """`ret` with its configs pickled, the launcher's secrets hidden first."""
    hydra_cfg = redacted_hydra_config(ret.hydra_cfg) if ret.hydra_cfg is not None else None
    held = HeldJobReturn.__new__(HeldJobReturn)
    # Every attribute as it is (Hydra 1.4's JobReturn has more, for tracebacks).
    held.__dict__.update(ret.__dict__)
    held.__dict__["cfg"] = _Pickled(cloudpickle.dumps(ret.cfg))
    held.__dict__["hydra_cfg"] = _Pickled(cloudpickle.dumps(hydra_cfg))
    held.output_dir = output_dir(ret)
    return held


def output_dir(ret: JobReturn) -> str | None:
    """The job's `hydra.runtime.output_dir`; None if it has no Hydra config."""
    if isinstance(ret, HeldJobReturn) and ret.pickled("hydra_cfg"):
        return ret.output_dir
    if ret.hydra_cfg is None:
        return None
    there = OmegaConf.select(ret.hydra_cfg, "hydra.runtime.output_dir", default=None)
    return there if isinstance(there, str) else None
