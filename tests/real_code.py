"""What the jobs of tests/apps/trainer.py saw, checked as its user would: each
job ran as `python trainer.py <its overrides>` would."""

import json
from pathlib import Path
from typing import Any

TRAINER = Path(__file__).parent / "apps" / "trainer.py"


def ran_as_its_script(
    sweep: Path,
    overrides: list[list[str]],
    *,
    relaunched: bool = True,
    defined_in_script: bool = True,
) -> list[dict[str, Any]]:
    """The reports of the sweep's jobs (job N ran with `overrides[N]`), after
    checking that each job's `__main__` was the app's own script at the path
    its argv[0] names, that its classes and helpers pickled (a checkpoint, fork
    and spawn pools, a process pool), that the resolvers the script registers
    resolved, and, if `relaunched`, that Lightning's relaunch of sys.argv ran
    the same job's config in its output dir. Also that the script's own code ran
    once per worker process, not once per job. `defined_in_script`: False when
    the script imports the app's code (its classes are not `__main__`'s)."""
    reports = []
    for num, job_overrides in enumerate(overrides):
        report = json.loads((sweep / str(num) / "report.json").read_text())
        x = report["x"]
        assert report["argv"][1:] == job_overrides, report
        assert report["main_name"] == "__main__", report
        assert report["main_file"] == report["argv"][0], report
        assert report["checkpoint"] is True, report
        assert report["fork"] == [1, 4, 9], report
        assert report["spawn"] == [1, 4, 9], report
        assert report["executor"] == [16, 25], report
        assert report["resolved"] == [2 * x, x + 100, 0.1], report
        assert ("Model" in report["classes"]) is defined_in_script, report
        if relaunched:
            assert report["relaunch"] is None, report  # no error
            rank = json.loads((sweep / str(num) / "rank1.json").read_text())
            assert rank["x"] == x and rank["pid"] != report["pid"]
            assert rank["argv"][: len(report["argv"])] == report["argv"], rank
        reports.append(report)
    if defined_in_script:  # else the task's module globals travel with it (cloudpickle)
        loads = {(r["pid"], r["loaded_as"]) for r in reports}
        pids, loaded = {r["pid"] for r in reports}, {r["loaded_as"] for r in reports}
        assert len(loads) == len(pids) == len(loaded)
    return reports
