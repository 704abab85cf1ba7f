"""The names the launching machine and the sweep's driver on a cluster's head
agree on: the files of the driver's working dir, the markers of the lines
they exchange, the oldest Ray a cluster may run. Here, below every layer,
because the watchdog on the head (`infra.autodown`) and the dashboard's
client (`infra.dashboard`) need them too; the typed parts of the contract
and the commands are in `driver.protocol`."""

import re

# The driver, run as `python -m DRIVER_MODULE` in its working dir on the head.
DRIVER_MODULE = "hydra_ray.driver.head"
# The files of the driver's working dir (a temp dir of the launch on the head),
# shared with the launcher: this plugin's source (both of its packages, and
# rich), the job spec it sends, the returns it brings home.
PLUGIN_DIR = "plugin"
JOB_SPEC = "job_spec.pkl"
RETURNS = "returns.pkl"
# The detached driver's output, its exit status, and the pid (and start time,
# see core.pids) of the shell that waits for it (see `driver_command`).
DRIVER_LOG = "driver.log"
DRIVER_RC = "driver.rc"
WRAPPER_PID = "driver_wrapper.pid"
STATE_MARK = "HYDRA_RAY_DRIVER="
# Where a sweep whose hydra.sweep.dir is absolute (a path of the launching
# machine), or relative but leading out of the working dir (`../out`) or the
# working dir itself, lives on the cluster: in the driver's working dir, as
# another relative one does, so that nothing is written, or left, outside it
# on the nodes, and two sweeps never share it.
HEAD_SWEEP_DIR = "sweep"
# The packages staged in PLUGIN_DIR that the jobs import on every node.
PACKAGES = ("hydra_plugins", "hydra_ray")
# Written in its working dir by the driver and by `gather` once they have tried to
# bring every node's outputs onto the head: {"complete": bool, "left": [{"node":
# IP, "node_id": ID, "paths": [...], "error": why}]}. The launcher tears the
# cluster down only after a complete one (a missing file means the gather did not
# end: outputs may still be on nodes).
GATHER_REPORT = "gather_report.json"

# The pack: one tar of a driver's results to bring home. The `ray_jobs`
# launcher's driver always packs; the cluster launchers' only with
# sync_down.storage. What to pack: PACK_PLAN in the driver's working dir
# (driver.protocol.PackPlan). For `ray_jobs`, PACK_MARK starts the line of the
# Ray job's log that says where the pack is (then a JSON object: size, sha256,
# node_ip, cluster_sweep, and node_id, file, pack_path in the log dir, or
# "storage": true when it went to sync_down.storage; and the pack's seal, see
# core.seal, over all of these).
PACK_PLAN = "pack_plan.json"
PACK_MARK = "HYDRA_RAY_PACK "
# In the pack: the returns and the gather report (if written), the records, the
# outputs (the sweep dir, filtered by sync_down, without the records).
PACK_RECORDS = "records"
PACK_OUTPUTS = "outputs"
# The cluster launchers' driver, once the pack is in the storage: STORED there
# says where ({"storage", "key", "size", "sha256"}), as does a file beside the
# pack in the storage (`stored_sidecar`), put last: a pack without it is not whole.
STORED = "stored.json"
# The cluster launchers' driver's gather report, as the launcher reads it back
# over ssh (a line of the head's output that starts with it), and the head's
# answer "that file is there".
REPORT_MARK = "HYDRA_RAY_GATHER_REPORT="
FOUND_MARK = "HYDRA_RAY_FOUND"


# The oldest Ray a cluster may run for the driver and the dashboard's APIs we use:
# pyproject.toml's lower bound of ray (a test holds them equal), tested in CI.
LOWEST_CLUSTER_RAY = (2, 40)
LOWEST_CLUSTER_RAY_TEXT = ".".join(str(n) for n in LOWEST_CLUSTER_RAY)


def older_than_lowest_ray(version: str) -> bool:
    """Whether `version` (Ray's `__version__`, or the dashboard's `ray_version`)
    names a Ray older than LOWEST_CLUSTER_RAY; a text that names no version is
    not refused here."""
    numbers = re.match(r"(\d+)\.(\d+)", version)
    return numbers is not None and tuple(int(n) for n in numbers.groups()) < LOWEST_CLUSTER_RAY


# The line a Ray job's entrypoint writes first: the Python it runs the driver with.
PYTHON_MARK = "HYDRA_RAY_DRIVER_PYTHON="
