"""Checks of the user's launcher config that run before anything is started."""

import logging
import os
from collections.abc import Mapping
from typing import Any

from hydra.errors import HydraException

log = logging.getLogger(__name__)

# ray.init() arguments that size a new local Ray; Ray refuses them when it
# connects to a running cluster, whose own resources apply.
_NODE_RESOURCE_KEYS = (
    "num_cpus",
    "num_gpus",
    "memory",
    "object_store_memory",
    "resources",
    "labels",
)


class ConfigError(HydraException):
    """A launcher config value that cannot work; the message names the key and the fix."""


def without_nulls(options: Mapping[str, Any]) -> dict[str, Any]:
    """Null means "Ray's default": such keys are not passed to Ray at all."""
    return {k: v for k, v in options.items() if v is not None}


def ray_init_kwargs(init: Mapping[str, Any]) -> dict[str, Any]:
    """The keyword arguments for `ray.init()` from `hydra.launcher.ray.init`."""
    kwargs = without_nulls(init)
    address = kwargs.get("address")
    env_address = os.environ.get("RAY_ADDRESS")
    if env_address and address is not None and address != env_address:
        log.warning(
            f"RAY_ADDRESS={env_address} is set: ray.init() connects there, not to "
            f"hydra.launcher.ray.init.address={address}. Unset RAY_ADDRESS to use the key."
        )
        address = env_address
    if address not in (None, "local"):
        ignored = [k for k in _NODE_RESOURCE_KEYS if k in kwargs]
        for key in ignored:
            log.warning(
                f"hydra.launcher.ray.init.{key}={kwargs.pop(key)} is ignored: connecting to "
                f"the running cluster at {address}, whose own resources apply (set them with "
                "`ray start`; per-job resources go in hydra.launcher.ray.remote)"
            )
    if "memory" in kwargs:
        # ray.init() calls the node's reservable memory `_memory`.
        kwargs["_memory"] = kwargs.pop("memory")
    return kwargs
