"""What the user reads about a sweep: the job list, a line per finished job,
and a closing line with the counts."""

import logging
import time
from collections.abc import Sequence

from hydra.core.utils import JobReturn, JobStatus, filter_overrides

log = logging.getLogger(__name__)


def describe(overrides: Sequence[str]) -> str:
    return " ".join(filter_overrides(overrides))


class SweepReport:
    """Logs a sweep's progress as its jobs finish, in whatever order they do."""

    def __init__(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> None:
        self._overrides = job_overrides
        self._first = initial_job_idx
        self._started = time.monotonic()
        self._failed: list[int] = []
        self._done = 0

    def job_list(self) -> None:
        for pos, overrides in enumerate(self._overrides):
            log.info(f"\t#{self._first + pos} : {describe(overrides)}")

    def job_done(self, idx: int, job_return: JobReturn, duration: float, node: str) -> None:
        self._done += 1
        ov = describe(self._overrides[idx - self._first])
        count = f"[{self._done}/{len(self._overrides)}]"
        if job_return.status == JobStatus.COMPLETED:
            log.info(f"{count} #{idx} : {ov} succeeded in {duration:.2f} s on {node}")
        else:
            self._failed.append(idx)
            err = job_return._return_value
            first_line = str(err).splitlines()[0] if str(err) else ""
            log.error(
                f"{count} #{idx} : {ov} FAILED after {duration:.2f} s on {node}: "
                f"{type(err).__name__}: {first_line}"
            )

    def close(self) -> None:
        total = len(self._overrides)
        elapsed = time.monotonic() - self._started
        line = f"{total} jobs done in {elapsed:.1f} s: {total - len(self._failed)} succeeded"
        if self._failed:
            nums = ", ".join(f"#{i}" for i in sorted(self._failed))
            log.error(f"{line}, {len(self._failed)} failed ({nums})")
        else:
            log.info(f"{line}, 0 failed")
