"""What an earlier version of the plugin wrote meets this one.

tests/fixtures/records_2.0.0.dev0 is the sweep dir that version (commit dea5626,
never released) wrote for `tests/apps/app.py --multirun x=1,2,3 fail_first=[2]
hydra.sweep.dir=sweep hydra.launcher.ray.init.num_cpus=1`: jobs #0 and #2
succeeded, job #1 raised. Its records carry no seal: a resume refuses them by
name, unread, and runs the jobs again once they are moved aside."""

import json
import shutil
import subprocess
from pathlib import Path

from .conftest import run_app

FIXTURE = Path(__file__).parent / "fixtures" / "records_2.0.0.dev0"


def test_a_sweep_recorded_by_2_0_0_dev0_is_refused_by_name_and_runs_again_once_moved_aside(
    ray_session: str, tmp_path: Path
) -> None:
    """Its records carry no seal (core.seal): this machine cannot tell them from
    ones anybody wrote there, so nothing of them is unpickled. The resume names
    each and prints the command that moves them aside; after it, the jobs run."""
    sweep = tmp_path / "sweep"
    shutil.copytree(FIXTURE, sweep)
    overrides = [
        "x=1,2,3",
        "fail_first=[2]",
        "hydra.sweep.dir=sweep",
        f"hydra.launcher.ray.init.address={ray_session}",
        "hydra.launcher.resume=true",
    ]
    res = run_app("app.py", *overrides, cwd=tmp_path)
    assert res.returncode == 1, res.output
    for n in range(3):
        assert f"job_{n}.pkl: carries no seal of this sweep" in res.output, res.output
    # Nothing ran, nothing changed.
    assert [len((sweep / str(n) / f"runs_{n}").read_text().split()) for n in range(3)] == [1, 1, 1]
    move_aside = res.output.split("then run the same command again:\n", 1)[1].splitlines()[0]
    subprocess.run(move_aside.strip(), shell=True, check=True)

    again = run_app("app.py", *overrides, cwd=tmp_path)
    assert again.returncode == 0, again.output
    runs = [len((sweep / str(n) / f"runs_{n}").read_text().split()) for n in range(3)]
    assert runs == [2, 2, 2]
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["return_value"] for j in summary["jobs"]] == [10, 20, 30]
