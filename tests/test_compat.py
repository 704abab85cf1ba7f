"""What an earlier version of the plugin wrote still works with this one.

tests/fixtures/records_2.0.0.dev0 is the sweep dir that version (commit dea5626)
wrote for `tests/apps/app.py --multirun x=1,2,3 fail_first=[2]
hydra.sweep.dir=sweep hydra.launcher.ray.init.num_cpus=1`: jobs #0 and #2
succeeded, job #1 raised. Its records pickle the plugin's classes by their
module paths of then: a move of a module must keep them loadable."""

import json
import shutil
import subprocess
import sys
import textwrap
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


def test_pickles_naming_the_old_module_paths_load_with_plain_pickle() -> None:
    """A JobReturn saved by a user or a sweeper names the classes by their paths of
    then (`_held.HeldJobReturn`, `_jobs.JobOutcome`): a fresh Python loads it,
    with the job's error, its config and its output dir."""
    load = textwrap.dedent(
        """
        import pickle, sys
        with open(sys.argv[1], "rb") as f:
            outcome = pickle.load(f)
        ret = outcome.job_return
        print(type(outcome).__module__, type(ret).__name__, ret.status.name)
        print(type(ret._return_value).__name__)
        print(ret.cfg.x, ret.output_dir.endswith("/1"))
        """
    )
    pkl = FIXTURE / ".hydra_ray" / "job_1.pkl"
    assert b"hydra_plugins.hydra_ray_launcher._held" in pkl.read_bytes()
    out = subprocess.run(
        [sys.executable, "-c", load, str(pkl)], capture_output=True, text=True, check=True
    ).stdout.split()
    assert out == ["hydra_ray.core.jobs", "HeldJobReturn", "FAILED", "RuntimeError", "2", "True"]
