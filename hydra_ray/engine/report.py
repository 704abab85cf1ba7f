"""What the user reads about a sweep while it runs and when it ends.

On a terminal: one display at the bottom of the screen that rich updates in
place (counts, elapsed time, time left, the latest job events), with the jobs'
own output and the launcher's log lines scrolling above it. Elsewhere (CI, a
file, `hydra.launcher.progress=false`): one plain log line per job event. At
the end: a table of every job, which `core.records` also writes as JSON.

rich is imported inside functions: the display is optional (plain lines without it).
"""

import logging
import os
import sys
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TextIO

from hydra.core.utils import filter_overrides

from hydra_ray.core.jobs import FAILED, INTERRUPTED, SUCCEEDED, TIMED_OUT, JobOutcome
from hydra_ray.core.redact import redacted, redacting_logger

if TYPE_CHECKING:
    from rich.console import Console, RenderableType
    from rich.live import Live

log = redacting_logger(__name__)

# Most rows the summary table shows; beyond that it shows the jobs that did not
# succeed, and sweep_summary.json lists them all.
MAX_TABLE_ROWS = 100
_RECENT_EVENTS = 6


def describe(overrides: Sequence[str]) -> str:
    """A job's overrides as every line about it shows them: a secret's value
    (`+api_token=...`) hidden."""
    return " ".join(redacted(o) for o in filter_overrides(overrides))


def described(resources: dict[str, float]) -> str:
    """A job's resources as the log and the summary show them: {CPU: 2, GPU: 0.5}."""
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in resources.items()) + "}"


def want_live(progress: bool) -> bool:
    """The live display is for a person at a terminal; logs and CI get lines."""
    return progress and sys.stdout.isatty() and os.environ.get("TERM", "") != "dumb"


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds + 0.5))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class SweepProgress:
    """Tracks a batch of jobs from queued to finished and shows it, live or as
    lines. Use as a context manager around the run: the live display starts on
    entry and is taken down on exit, also on an error."""

    def __init__(
        self,
        jobs: Sequence[tuple[int, Sequence[str]]],
        *,
        live: bool,
        width: int | None = None,
        already_done: int = 0,
    ) -> None:
        self._overrides = {idx: list(ov) for idx, ov in jobs}
        self._live_wanted = live
        self._width = width
        self._total = len(jobs) + already_done
        self._already = already_done
        self._started_at = time.monotonic()
        self._running: dict[int, str] = {}
        self._counts = {SUCCEEDED: 0, FAILED: 0, TIMED_OUT: 0}
        self._failed: list[int] = []
        self._events: deque[str] = deque(maxlen=_RECENT_EVENTS)
        self._live: Live | None = None

    # ---- Events, from the engine ----

    def started(
        self, idx: int, node: str, attempt: int, resources: dict[str, float] | None = None
    ) -> None:
        self._running[idx] = node
        text = f"#{idx} : {describe(self._overrides[idx])} started on {node}"
        if resources is not None:
            text += f" with {described(resources)}"
        if attempt > 1:
            text += f" (attempt {attempt})"
        self._event(text, logging.INFO, quiet_when_live=True)

    def retrying(self, outcome: JobOutcome, next_attempt: int) -> None:
        self._running.pop(outcome.idx, None)
        self._event(
            f"#{outcome.idx} : {describe(self._overrides[outcome.idx])} attempt "
            f"{outcome.attempt} failed after {outcome.duration:.2f} s on {outcome.node}: "
            f"{outcome.error}; running it again (attempt {next_attempt})",
            logging.WARNING,
        )

    def finished(self, outcome: JobOutcome) -> None:
        self._running.pop(outcome.idx, None)
        self._counts[outcome.status] = self._counts.get(outcome.status, 0) + 1
        done = self._already + sum(self._counts.values())
        ov = describe(self._overrides[outcome.idx])
        tries = f" (attempt {outcome.attempt})" if outcome.attempt > 1 else ""
        if outcome.ray_reruns:
            tries += ", run again by Ray after its first process died"
        where = f"{outcome.duration:.2f} s on {outcome.node}{tries}"
        if outcome.status == SUCCEEDED:
            self._event(f"[{done}/{self._total}] #{outcome.idx} : {ov} succeeded in {where}")
        else:
            self._failed.append(outcome.idx)
            self._event(
                f"[{done}/{self._total}] #{outcome.idx} : {ov} {outcome.status.upper()} after "
                f"{where}: {outcome.error}",
                logging.ERROR,
            )

    def close(self) -> None:
        """The closing line with the counts."""
        done = sum(self._counts.values())
        took = time.monotonic() - self._started_at
        line = (
            f"{done} job{'s' if done != 1 else ''} done in {took:.1f} s: "
            f"{self._counts[SUCCEEDED]} succeeded"
        )
        if self._already:
            line += f" ({self._already} more succeeded earlier and were not run again)"
        if self._failed:
            nums = ", ".join(f"#{i}" for i in sorted(self._failed))
            log.error(f"{line}, {len(self._failed)} failed ({nums})")
        else:
            log.info(f"{line}, 0 failed")

    def _event(self, text: str, level: int = logging.INFO, quiet_when_live: bool = False) -> None:
        self._events.append(text)
        if self._live is not None and quiet_when_live:
            return  # shown in the display (at its next refresh) only: not worth a log line
        log.log(level, text)

    # ---- The live display ----

    def __enter__(self) -> "SweepProgress":
        if self._live_wanted:
            self._start_live()
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if self._live is not None:
            live, self._live = self._live, None
            _restore_handlers()
            live.stop()
        if exc_type is None:
            self.close()

    def _start_live(self) -> None:
        from rich.live import Live

        out, err = sys.stdout, sys.stderr
        self._live = Live(
            get_renderable=self._render,
            console=_console(self._width),
            refresh_per_second=4,
            redirect_stdout=True,
            redirect_stderr=True,
            transient=False,
        )
        self._live.start()
        # Log handlers hold the streams they were given; point them at rich's
        # proxies (sys.stdout/err now), so log lines print above the display.
        for handler in _stream_handlers():
            if handler.stream is out or handler.stream is err:
                _swapped.append((handler, handler.stream))
                handler.setStream(sys.stdout if handler.stream is out else sys.stderr)

    def _render(self) -> "RenderableType":
        from rich.console import Group
        from rich.progress_bar import ProgressBar
        from rich.table import Table
        from rich.text import Text

        done = self._already + sum(self._counts.values())
        elapsed = time.monotonic() - self._started_at
        ran_now = done - self._already
        left = ""
        if ran_now > 0 and done < self._total:
            left = f" · ~{_duration(elapsed / ran_now * (self._total - done))} left"
        queued = self._total - done - len(self._running)
        status = Text.assemble(
            (f"{done}/{self._total} jobs", "bold"),
            f" · {len(self._running)} running · {queued} queued · ",
            (f"{self._counts[SUCCEEDED]} succeeded", "green"),
            " · ",
            (f"{len(self._failed)} failed", "red" if self._failed else ""),
            f" · {_duration(elapsed)} elapsed{left}",
        )
        # The counts never wrap; the bar takes the rest of the line.
        head = Table.grid(padding=(0, 1), expand=True)
        head.add_column(no_wrap=True)
        head.add_column(ratio=1, min_width=10)
        head.add_row(status, ProgressBar(total=max(self._total, 1), completed=done))
        # Called from rich's refresh thread: a snapshot (tuple() of a deque holds the GIL).
        events = [Text(f"  {e}", overflow="ellipsis", no_wrap=True) for e in tuple(self._events)]
        return Group(head, *events)


def _console(width: int | None) -> "Console":
    from rich.console import Console

    # force_terminal: the head driver of a cluster launcher draws for the user's
    # terminal through ssh, where its own stdout is not a terminal.
    return Console(file=sys.stdout, force_terminal=True, width=width)


# Quoted: logging.StreamHandler is subscriptable only from Python 3.11, and a
# module-level or signature annotation is evaluated when the module is imported.
_swapped: "list[tuple[logging.StreamHandler[Any], TextIO]]" = []


def _restore_handlers() -> None:
    while _swapped:
        handler, stream = _swapped.pop()
        handler.setStream(stream)


def _stream_handlers() -> "list[logging.StreamHandler[Any]]":
    loggers = [logging.getLogger()] + [
        lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)
    ]
    return [
        h
        for lg in loggers
        for h in lg.handlers
        if type(h) is logging.StreamHandler  # not FileHandler, a subclass
    ]


# ---- The summary ----


def summary_table(outcomes: Sequence[JobOutcome], *, terminal: bool, width: int | None) -> str:
    """The table of jobs, rendered as text (with colours and box lines on a
    terminal, plain ASCII elsewhere)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    rows = sorted(outcomes, key=lambda o: o.idx)
    hidden = ""
    if len(rows) > MAX_TABLE_ROWS:
        shown = [o for o in rows if o.status != SUCCEEDED][:MAX_TABLE_ROWS]
        left_out = len(rows) - len(shown)
        kind = "succeeded jobs" if len(shown) == len(rows) - _succeeded(rows) else "jobs"
        hidden = f"({left_out} {kind} not shown: every job is in sweep_summary.json)"
        if not shown:
            return hidden
        hidden = "\n" + hidden
        rows = shown
    table = Table(box=box.SIMPLE_HEAD if terminal else box.ASCII, title_justify="left")
    # Resources only where hydra.launcher.ray.remote differs per job.
    per_job = any(o.resources is not None for o in rows)
    for name, justify in (
        ("#", "right"),
        ("overrides", "left"),
        ("status", "left"),
        ("duration", "right"),
        ("attempts", "right"),
        ("node", "left"),
        *([("resources", "left")] if per_job else []),
        ("error", "left"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    style = {SUCCEEDED: "green", FAILED: "red", TIMED_OUT: "red", INTERRUPTED: "yellow"}
    for o in rows:
        status = o.status + (" (earlier run)" if o.resumed else "")
        # Text cells: overrides (`tags=[a,b]`) and errors are not rich markup.
        table.add_row(
            Text(str(o.idx)),
            Text(describe(o.job_return.overrides or [])),
            Text(status, style=style.get(o.status, "") if terminal else ""),
            Text(f"{o.duration:.1f} s" if o.status != INTERRUPTED else ""),
            Text(f"{o.attempt} +{o.ray_reruns} Ray" if o.ray_reruns else str(o.attempt)),
            Text(o.node),
            *([Text(described(o.resources) if o.resources else "")] if per_job else []),
            Text(o.error or (f"outputs not home, {o.outputs_left}" if o.outputs_left else "")),
        )
    buf = io.StringIO()
    console = Console(
        file=buf,
        force_terminal=terminal,
        no_color=not terminal,
        width=width or 200,
        highlight=False,
    )
    console.print(table)
    return buf.getvalue().rstrip() + hidden


def _succeeded(outcomes: Sequence[JobOutcome]) -> int:
    return sum(o.status == SUCCEEDED for o in outcomes)
