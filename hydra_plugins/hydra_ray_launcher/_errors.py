"""What a launch on a cluster raises when the sweep could not run or its results
did not come home. Compact: Hydra prints the message, which says what happened
and what to do, not a traceback of the plugin (HYDRA_FULL_ERROR=1 shows it)."""

from hydra.errors import CompactHydraException


class DriverError(CompactHydraException):
    """The sweep's driver on the cluster did not start, or ended without the
    jobs' results."""


class OutputsNotHomeError(CompactHydraException):
    """Results or outputs of the sweep did not come home: where they are is named."""


class LostDashboardError(CompactHydraException):
    """The connection to the dashboard broke while the Ray job ran on."""
