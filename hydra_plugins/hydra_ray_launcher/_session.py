"""What a launch path gets from the launcher Hydra made: Hydra's context, the
app, the multirun's config, and what the sweep keeps across the sweeper's
batches. Each launch path fills the fields it uses; none sees a Launcher."""

from dataclasses import dataclass
from typing import TYPE_CHECKING

from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from ._cluster import ClusterLifetime
    from ._engine import ShippedState
    from ._sweep import SweepBook


@dataclass
class Session:
    hydra_context: HydraContext
    task_function: TaskFunction
    config: DictConfig
    # The sweep's jobs and outcomes across batches (summary, resume): made at the
    # first launch().
    book: "SweepBook | None" = None
    # `ray`: the sweep state in Ray's object store, shipped at the first launch()
    # and reused by the next batches while the Ray connection lives.
    shipped: "ShippedState | None" = None
    # `ray_aws`/`ray_cluster`: the multirun's one cluster, made at the first launch().
    lifetime: "ClusterLifetime | None" = None
