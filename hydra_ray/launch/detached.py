"""The one path of a sweep run by a detached driver (`driver.head`) on a
cluster, whichever way the launcher reaches it: on a resume, the runs an
earlier launch started and did not bring home are followed and brought home
first; then a run for the rest. What differs between the two ways is a
`Transport`: ssh and rsync through Ray's cluster launcher (`launch.cluster`),
or the dashboard's Jobs API (`launch.jobs_api`). Shared here too: following
again after a lost connection, a pack's trip home (verified, then unpacked),
and the outcomes read back from the returns or, failing those, the records."""

import dataclasses
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from hydra_ray.core.jobs import INTERRUPTED, JobOutcome
from hydra_ray.core.records import detached_runs, move_records_home, moved_home, read_record
from hydra_ray.driver.protocol import (
    extract_pack,
    load_outcomes,
    sweep_dir_on_cluster,
    verify_pack,
)
from hydra_ray.launch.sweep import Batch, SweepBook


class Transport(Protocol):
    """How one launcher reaches the detached drivers of a sweep."""

    # The record dir's file that notes each run this transport started (see
    # core.records.detached_runs), by its id: a temp dir on the head, a Ray job.
    notes: str

    def run(self, remaining: Batch) -> list[JobOutcome]:
        """Start a driver for `remaining`'s jobs, follow it, bring everything home."""
        ...

    def reattach(self, run_id: str, noted: Mapping[str, Any], jobs: list[int]) -> list[JobOutcome]:
        """An earlier launch's run of `jobs`, followed to its end and brought
        home: the outcomes it has (none when it is gone: its jobs run again)."""
        ...


def run_batch(transport: Transport, book: SweepBook, current: Batch) -> list[JobOutcome]:
    """The batch's outcomes: on a resume, first those of the runs an earlier
    launch of the sweep started and did not bring home (they may still run);
    then one new run for the rest."""
    got = _reattach(transport, book, current) if book.settings.resume else {}
    outcomes = [got[job.idx] for job in current.to_run if job.idx in got]
    rest = [job for job in current.to_run if job.idx not in got]
    if not rest:
        return outcomes
    remaining = dataclasses.replace(
        current, to_run=rest, already_done=current.already_done + len(outcomes)
    )
    return outcomes + transport.run(remaining)


def _reattach(transport: Transport, book: SweepBook, current: Batch) -> dict[int, JobOutcome]:
    """By job, the outcomes of the earlier runs of this batch's jobs that did
    not come home. A job a run did not finish is not among them (it runs again)."""
    wanted = {job.idx for job in current.to_run}
    got: dict[int, JobOutcome] = {}
    for run_id, noted in detached_runs(book.sweep_dir, transport.notes).items():
        jobs = sorted({int(i) for i in noted.get("jobs", [])})
        if noted.get("home") or not wanted.intersection(jobs):
            continue
        outcomes = transport.reattach(run_id, noted, jobs)
        got.update((o.idx, o) for o in outcomes if o.idx in wanted and o.status != INTERRUPTED)
    return got


class Reconnect:
    """How long to wait before following a driver again after its connection
    dropped: 1 s, doubled up to 15 s, while the connection has been lost for
    at most `budget_s` (hydra.launcher.reconnect_s)."""

    def __init__(self, budget_s: float):
        self.budget_s = budget_s
        self.wait_s = 1.0
        self._lost_since: float | None = None

    def given_up(self) -> bool:
        """After a loss: whether it has lasted longer than the budget."""
        self._lost_since = self._lost_since or time.monotonic()
        return time.monotonic() - self._lost_since > self.budget_s

    def pause(self) -> None:
        time.sleep(self.wait_s)
        self.wait_s = min(self.wait_s * 2, 15.0)


def nums(jobs: Iterable[int]) -> str:
    return ", ".join(f"#{i}" for i in sorted(jobs))


def outcomes_home(
    returns: Path | None, home: Path | None, book: SweepBook, jobs: Sequence[int]
) -> list[JobOutcome]:
    """The outcomes of a driver's `jobs`: its returns (sealed) if it wrote them,
    else the records of those that finished. Their output dirs are where the
    outputs came `home` (None: they did not, sync_down brought another dir)."""
    if returns is None:
        found = (read_record(book.sweep_dir, idx, book.key) for idx in jobs)
        return [o for o in found if o is not None]
    outcomes = load_outcomes(str(returns), book.key)
    if home is None:
        return outcomes
    given = sweep_dir_on_cluster(str(book.sweep_dir))
    return [moved_home(o, given, home) for o in outcomes]


def unpack_home(
    book: SweepBook,
    pack: Path,
    said: Mapping[str, Any],
    source: str,
    outputs_to: Path,
    home: Path | None,
) -> tuple[list[int], Path | None]:
    """A driver's pack, fetched to `pack` (named as this launcher named it) and
    checked against what `said` says of it: untarred only if its seal verifies
    with the sweep's key (raises Unauthentic, naming `source`, otherwise); its
    records into the record dir, its outputs into `outputs_to`. The records then
    say where the jobs' files are here (`home`, unless None). The jobs whose
    records came, and where the returns are (None if the driver wrote none)."""
    verify_pack(book.key, pack.name, said, source)
    idxs, returns = extract_pack(pack, pack.parent / "unpacked", book.sweep_dir, outputs_to)
    if home is not None:
        given = sweep_dir_on_cluster(str(book.sweep_dir))
        move_records_home(book.sweep_dir, idxs, given, home, book.key)
    return idxs, returns
