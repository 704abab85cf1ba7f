"""A cluster that tears itself down when nobody comes back
(`hydra.launcher.autodown_minutes`): a watchdog on the head, started by the
launcher that creates (or re-uses) the cluster, that runs Ray's own teardown
there once the cluster has been idle that long.

Idle: no sweep driver runs on the head (`hydra_ray.driver.protocol`'s
detached driver) and nothing is transferred to or from it (an rsync: the
launcher's sync up or bring-home, or a user's `ray rsync-down` from the
commands a kept cluster prints). A launcher that lives never leaves the
cluster idle that long: it follows its driver, brings everything home, then
tears the cluster down or disarms the watchdog (`stop_cluster=false`). So the
deadline is met only when the launcher is gone (kill -9, a closed laptop, a
lost network) or when it kept the cluster for outputs that did not come home,
and then it said the deadline's clock time. When every launch's results left
on the head are also in sync_down.storage (the driver wrote `stored.json`
beside them, core.wire.STORED), none waits there, and a short grace replaces the deadline;
those launch dirs are removed before the teardown (a cloud's disks go with
it, an on-prem host's stay).

The watchdog is a shell script (the head need not have this plugin
installed), in ~/.hydra_ray/autodown/CLUSTER on the head (or its container),
with its log there.
"""

import base64
import math
import shlex
from dataclasses import dataclass

from hydra_ray.core.pids import pid_in, still_runs, write_own_pid
from hydra_ray.core.wire import DRIVER_RC, STORED, WRAPPER_PID

# On the head, relative to the home dir: one dir per cluster.
WATCH_DIR = ".hydra_ray/autodown"
# Ray's cluster launcher writes the cluster's config (with the provider and the
# auth that reach every node) on the head, for its autoscaler: Ray's own
# teardown from the head uses it.
BOOTSTRAP_CONFIG = "~/ray_bootstrap_config.yaml"

# Files of the watch dir: the idle seconds that end the cluster, those when
# every result not taken home is in sync_down.storage, the seconds between two
# looks, the teardown command, the time of the last activity (mtime), the
# watchdog's pid.
_LIMIT = "limit"
_GRACE = "grace"
_POLL = "poll"
_DOWN = "down"
_SEEN = "seen"
_PID = "pid"
_SCRIPT = "watch.sh"
_LOG = "log"
_ALIVE = "alive"
# Whether the cluster's Ray still runs on the head (its GCS); the pattern does
# not match grep's own command line.
RAY_ALIVE = "grep -qas 'gcs_serve[r]' /proc/[0-9]*/cmdline"

# See `Autodown.grace_s`.
STORED_GRACE_S = 60
# Where each launch's private dir on the head is made (`hydra-ray-*`), with its
# driver's files in it.
TMP_ROOT = "/tmp"

# Run as `sh watch.sh TMP_ROOT` in the watch dir; it reads its settings at each
# look, so that arming it again changes them.
_WATCH = r"""
root=$1
# Written whole or not at all: a reader never sees an empty pid.
@WRITE_OWN_PID@
say() { echo "$(date '+%F %T') $*"; }
say "watching: the cluster is torn down after $(cat limit) s without a sweep driver or a transfer"
tries=0
gone=0
while sleep "$(cat poll)"; do
  # Ray stopped on the head by someone else (`ray down` of the printed commands,
  # `ray stop`): nothing left to tear down. Twice in a row: not a `ray up` restart.
  if sh -c "$(cat alive)"; then gone=0; else
    gone=$((gone + 1))
    if [ "$gone" -ge 2 ]; then
      say "Ray no longer runs on the head (ray down or ray stop): nothing to tear down"
      rm -f pid
      exit 0
    fi
    continue
  fi
  busy=
  for p in "$root"/hydra-ray-*/@WRAPPER_PID@; do
    [ -s "$p" ] || continue
    [ -s "${p%/*}/@DRIVER_RC@" ] && continue
    @DRIVER_RUNS@ && busy=1
  done
  rsync='^(/[[:alnum:]._-]+)*/?rsync'
  [ -z "$busy" ] && grep -qasE "$rsync" /proc/[0-9]*/cmdline && busy=1
  if [ -n "$busy" ]; then touch seen; continue; fi
  # A launch's dir the launcher did not take home: its results wait here,
  # unless they are in sync_down.storage.
  waiting=; stored=
  for d in "$root"/hydra-ray-*/; do
    [ -d "$d" ] || continue
    if [ -f "$d/@STORED@" ]; then stored=1; else waiting=1; fi
  done
  limit=$(cat limit)
  if [ -n "$stored" ] && [ -z "$waiting" ] && [ "$limit" -gt "$(cat grace)" ]; then
    limit=$(cat grace)
  fi
  idle=$(( $(date +%s) - $(stat -c %Y seen) ))
  [ "$idle" -lt "$limit" ] && continue
  say "idle for $idle s (hydra.launcher.autodown_minutes): tearing the cluster down"
  for d in "$root"/hydra-ray-*/; do
    [ -f "$d/@STORED@" ] && rm -rf "$d" && say "removed $d: its results are in the storage"
  done
  sh -c "$(cat down)"
  rc=$?
  say "teardown ended with status $rc"
  tries=$((tries + 1))
  if [ "$rc" = 0 ] || [ "$tries" -ge 3 ]; then rm -f pid; exit "$rc"; fi
done
"""
# Pid files that a reused pid cannot fool (core.pids).
for _mark, _value in (
    ("@WRITE_OWN_PID@", write_own_pid("pid")),
    ("@DRIVER_RUNS@", still_runs('"$p"')),
    ("@WRAPPER_PID@", WRAPPER_PID),
    ("@DRIVER_RC@", DRIVER_RC),
    ("@STORED@", STORED),
):
    _WATCH = _WATCH.replace(_mark, _value)


@dataclass(frozen=True)
class Autodown:
    """The watchdog of one cluster: `minutes` idle end it; its teardown does
    what hydra.launcher.teardown_cluster says."""

    cluster_name: str
    minutes: float
    workers_only: bool = False
    keep_min_workers: bool = False
    tmp_root: str = TMP_ROOT

    @property
    def limit_s(self) -> int:
        return max(1, math.ceil(self.minutes * 60))

    @property
    def grace_s(self) -> int:
        """The idle seconds when every result not taken home is in
        sync_down.storage: none waits on the head, so the cluster need not
        either; a launcher that lives is never idle that long."""
        return min(self.limit_s, STORED_GRACE_S)

    @property
    def poll_s(self) -> float:
        """How often the watchdog looks: often enough for a short deadline."""
        return min(30.0, max(1.0, self.limit_s / 10))

    def _dir(self) -> str:
        return f"~/{WATCH_DIR}/{shlex.quote(self.cluster_name)}"

    def teardown_command(self) -> str:
        """Ray's teardown as the head runs it: `ray stop` first (the head's
        autoscaler would start the workers again meanwhile; with provider
        `local` Ray's own teardown from the head does not stop the head), then
        `ray down` with the bootstrap config."""
        flags = " --workers-only" if self.workers_only else ""
        flags += " --keep-min-workers" if self.keep_min_workers else ""
        down = f"ray down -y{flags} {BOOTSTRAP_CONFIG}"
        return down if self.workers_only else f"ray stop; {down}"

    def start_command(self) -> str:
        """Shell command, run on the head, that arms the watchdog (or, if one
        already runs there, sets its deadline) and counts from now."""
        script = base64.b64encode(_WATCH.encode()).decode()
        start = (
            f"echo {script} | base64 -d > {_SCRIPT} && "
            f"setsid nohup sh {_SCRIPT} {shlex.quote(self.tmp_root)} "
            f">> {_LOG} 2>&1 < /dev/null &"
        )
        return (
            f"mkdir -p {self._dir()} && cd {self._dir()} && "
            f"echo {self.limit_s} > {_LIMIT} && echo {self.grace_s} > {_GRACE} && "
            f"echo {self.poll_s:g} > {_POLL} && "
            f"echo {shlex.quote(self.teardown_command())} > {_DOWN} && "
            f"echo {shlex.quote(RAY_ALIVE)} > {_ALIVE} && touch {_SEEN} && "
            f"if [ -s {_PID} ] && {still_runs(_PID)}; then :; else {start} fi"
        )

    def seen_command(self) -> str:
        """Shell command, run on the head, that restarts the idle clock."""
        return f"touch {self._dir()}/{_SEEN}"

    def stop_command(self) -> str:
        """Shell command, run on the head, that disarms the watchdog and removes its dir."""
        d = self._dir()
        pid = f"{d}/{_PID}"
        return f"if [ -s {pid} ] && {still_runs(pid)}; then kill {pid_in(pid)}; fi; rm -rf {d}"

    def log_path(self) -> str:
        return f"~/{WATCH_DIR}/{self.cluster_name}/{_LOG}"
