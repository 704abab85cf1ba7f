"""Every exception of the launcher, in one place. The user-facing ones derive
from LauncherError: compact, so Hydra prints their message (what happened and
what to do), not a traceback of the plugin (HYDRA_FULL_ERROR=1 shows it). The
others are caught inside the launcher and turned into one of those, or into a
failed job's outcome. Imports nothing of the launcher's but its redaction."""

from pathlib import Path

from hydra.errors import CompactHydraException

from hydra_ray.core.redact import redacted


class LauncherError(CompactHydraException):
    """A sweep that cannot start, or could not finish, for a reason its message
    names; the message goes through the redaction that every log line does
    (core.redact): a value it quotes (an address, a URI, an override) never
    shows a secret."""

    def __init__(self, message: str = "") -> None:
        super().__init__(redacted(message))


class ConfigError(LauncherError):
    """A launcher config value that cannot work; the message names the key and the fix.
    Raised before anything costly starts (Ray, a cluster, an upload)."""


class ResourceError(ConfigError):
    """A value of `hydra.launcher.ray.remote` does not resolve for a job."""


class DriverError(LauncherError):
    """The sweep's driver on the cluster did not start, or ended without the
    jobs' results."""


class OutputsNotHomeError(LauncherError):
    """Results or outputs of the sweep did not come home: where they are is named."""


class LostDashboardError(LauncherError):
    """The connection to the dashboard broke while the Ray job ran on."""


class UnsafeArchive(LauncherError):
    """An archive from a cluster or a storage would write outside its target:
    nothing of it was extracted."""


class Unauthentic(LauncherError):
    """A file that came from a cluster or a storage does not verify as its
    sweep's (core.seal): nothing of it was unpickled or extracted."""


class JobError(RuntimeError):
    """A failed job's return value: stands for a job's exception that could not
    travel back from the worker, or for a job that ended without returning (its
    process or node died, it timed out). Pickled into records: also importable
    from `_jobs`, its module before."""


class TaskLost(Exception):
    """A job's task ended without a result (its process or node died, after
    Ray's retries; it was cancelled): the reason. The engine's backend raises
    it to its scheduler, which makes it the job's failed outcome."""


class ClusterCommandError(RuntimeError):
    """A command or a transfer on the cluster failed (what Ray's SDK raised is its cause)."""


class PartCorrupted(RuntimeError):
    """A node's tar file of job outputs did not arrive as it was packed."""


class UnreadableRecord(Exception):
    """A record or manifest of an earlier sweep that exists but cannot be used:
    a resume stops rather than run a finished job again or drop its result."""

    def __init__(self, path: Path, why: str):
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why
