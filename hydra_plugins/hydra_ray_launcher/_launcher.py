"""What the three launchers share: Hydra's `setup()`, which makes the session a
launch path works with (`hydra_ray.launch.sweep.Session`). Each launcher module adds its
`launch()`, which imports its launch path lazily: Hydra imports the launcher
modules at every start of every app, and in every Ray worker, and they import
nothing of the implementation at module level."""

from typing import TYPE_CHECKING, Any

from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

if TYPE_CHECKING:
    from hydra_ray.launch.sweep import Session


class RayLauncherBase(Launcher):
    """Abstract (no `launch()`): Hydra's plugin scan does not list it."""

    def __init__(self, **settings: Any) -> None:
        # The settings are read from the Hydra config given to setup(), as one node.
        self.session: Session | None = None

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        from hydra_ray.launch.sweep import Session

        if self.session is None:
            self.session = Session(hydra_context, task_function, config)
        else:  # set up again: what the sweep keeps (its book, its cluster) stays
            self.session.hydra_context = hydra_context
            self.session.task_function = task_function
            self.session.config = config

    def ready(self) -> "Session":
        """The session, once Hydra has called setup() (as it does before launch())."""
        assert self.session is not None, "Hydra calls setup() before launch()"
        return self.session
