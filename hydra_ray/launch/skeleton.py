"""The one launch skeleton every launcher goes through: Hydra's logging set up,
the dry run, the checks before anything costs, the sweep's book (records,
resume, summary) made at the first batch, the batch run, and the stop on
Ctrl-C. A launch path (`local`, `cluster`, `jobs_api`) provides only its
hooks (`LaunchPath`): it never sees a Launcher, only the `Session`."""

from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from hydra.core.utils import JobReturn, configure_log, setup_globals

from hydra_ray.core.jobs import JobOutcome
from hydra_ray.launch.sweep import Batch, Session, SweepBook, batch, sweep_settings, task_overrides


class LaunchPath:
    """How one launcher reaches Ray: the hooks the skeleton calls. The ones with
    a body here are optional."""

    def prepare_process(self, session: Session) -> None:
        """Before anything else, each launch (environment variables Ray reads)."""

    def dry_run(
        self, session: Session, job_overrides: Sequence[Sequence[str]], first: int
    ) -> NoReturn:
        """Print the plan and every problem, then exit (hydra.launcher.dry_run)."""
        raise NotImplementedError

    def check(self, session: Session) -> None:
        """At the first batch, before the sweep dir is made: raise ConfigError for
        anything that cannot work, before Ray, a cluster or an upload costs
        anything; keep on the session what the checks made (the cluster)."""
        raise NotImplementedError

    def run_batch(self, session: Session, book: SweepBook, current: Batch) -> list[JobOutcome]:
        """Run the batch's jobs to run; their outcomes, in their order."""
        raise NotImplementedError

    def interrupted(self) -> None:
        """Ctrl-C ended the batch: stop what this process started (it re-raises)."""


def launch(
    path: LaunchPath,
    session: Session,
    job_overrides: Sequence[Sequence[str]],
    initial_job_idx: int,
) -> Sequence[JobReturn]:
    """One launch() of the sweeper: its jobs' JobReturns, in order. Raises
    ConfigError (before anything costs) and whatever the path raises."""
    config = session.config
    settings = session.settings
    path.prepare_process(session)
    setup_globals()
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if settings.dry_run:
        path.dry_run(session, job_overrides, initial_job_idx)
    if session.book is None:
        # Everything that can be refused is refused here, before anything costs.
        path.check(session)  # every problem, the settings' too, in one error
        sweep = sweep_settings(settings)
        sweep_dir = Path(str(config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        session.book = SweepBook(sweep_dir, task_overrides(config), sweep)
    book = session.book
    try:
        with batch(book, job_overrides, initial_job_idx) as current:
            if current.to_run:
                current.outcomes = path.run_batch(session, book, current)
        return current.returns
    except KeyboardInterrupt:
        path.interrupted()
        raise
