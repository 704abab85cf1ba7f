"""A job runs as `python train.py <its overrides>` would: the app's own script is
its `__main__` and its command line is the job's, on a local Ray and through Ray
Client (ray_jobs and the cluster launchers: in their own test modules). The app,
tests/apps/trainer.py, is shaped like training code (see its docstring)."""

import ast
import json
import os
import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from hydra_ray.core.jobs import Script
from hydra_ray.engine.script import _NotMain, as_main, left_out_warning, load, sent_from

from .conftest import APPS, SMALL_RAY, free_port, ray_head, run_app, run_python
from .real_code import TRAINER, ran_as_its_script

NO_TOKEN = {"RAY_AUTH_MODE": "disabled"}
REPO = Path(__file__).parents[1]


def _app_copy(where: Path, *, rename: tuple[str, str] | None = None) -> Path:
    """trainer.py and its config in `where` (a class renamed in it, if asked)."""
    where.mkdir(parents=True, exist_ok=True)
    source = TRAINER.read_text()
    if rename is not None:
        source = source.replace(*rename)
    (where / "trainer.py").write_text(source)
    shutil.copy(APPS / "trainer.yaml", where)
    return where / "trainer.py"


def _sweep_succeeds(
    ray_session: str, sweep: Path, *command: str, cwd: Path, timeout: float = 180
) -> None:
    """`python COMMAND` (a script or `-m module`, then `--multirun` and overrides),
    its sweep dir `sweep`, run in `cwd` on the session's Ray: it exits 0."""
    res = run_python(
        *command,
        f"hydra.sweep.dir={sweep}",
        f"hydra.launcher.ray.init.address={ray_session}",
        cwd=cwd,
        timeout=timeout,
    )
    assert res.returncode == 0, res.output


def test_a_job_runs_as_its_script_would_on_a_local_ray(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    res = run_app("trainer.py", "x=1,2,3,4", *SMALL_RAY, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert res.returncode == 0, res.output
    reports = ran_as_its_script(sweep, [[f"x={x}"] for x in (1, 2, 3, 4)])
    assert {r["argv"][0] for r in reports} == {str(TRAINER)}
    assert {r["original_cwd"] for r in reports} == {str(tmp_path)}
    # A job's checkpoint of the script's Model loads as one that `python trainer.py` wrote.
    load = (
        "import pickle, sys\nclass Model: pass\nprint(pickle.load(open(sys.argv[1], 'rb')).weights)"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", load, str(sweep / "0" / "model.pkl")], capture_output=True, text=True
    )
    assert loaded.stdout.split() == ["[0,", "1,", "4,", "9]"], loaded.stderr


def test_a_job_that_starts_and_ends_a_fork_pool_again_and_again_never_hangs(
    ray_session: str, tmp_path: Path
) -> None:
    """A Ray worker's SIGTERM handler, inherited by the processes it forks, let a
    pool worker outlive Pool.terminate() when the signal came early: the job
    waited for it forever (30 pools per job hung the first sweep tried)."""
    sweep = tmp_path / "sweep"
    _sweep_succeeds(
        ray_session,
        sweep,
        str(TRAINER),
        "--multirun",
        "x=1,2",
        "fork_pools=30",
        "relaunch=false",
        cwd=tmp_path,
        timeout=120,
    )
    ran_as_its_script(
        sweep,
        [["x=1", "fork_pools=30", "relaunch=False"], ["x=2", "fork_pools=30", "relaunch=False"]],
        relaunched=False,
    )


def test_the_training_code_example_trains_each_job_on_two_ranks(
    ray_session: str, tmp_path: Path
) -> None:
    example = tmp_path / "training_code"
    shutil.copytree(REPO / "examples" / "training_code", example)
    sweep = tmp_path / "sweep"
    _sweep_succeeds(
        ray_session, sweep, "train.py", "--multirun", "lr=0.1,0.01", "ranks=2", cwd=example
    )
    load = "import pickle, sys\nclass Model: ...\nprint(pickle.load(open(sys.argv[1], 'rb')).w)"
    for num in (0, 1):
        weights = {
            subprocess.run(
                [sys.executable, "-c", load, str(sweep / str(num) / f"model_rank{rank}.pkl")],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            for rank in (0, 1)
        }
        assert len(weights) == 1 and float(weights.pop()) > 0  # both ranks trained alike
    assert (sweep / "1" / "rank_1.log").read_text().count("rank 1 epoch") == 5


def test_an_app_run_with_python_m_is_relaunched_with_m(ray_session: str, tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    _app_copy(package)
    (package / "__init__.py").write_text("")
    sweep = tmp_path / "sweep"
    _sweep_succeeds(ray_session, sweep, "-m", "pkg.trainer", "--multirun", "x=1,2", cwd=tmp_path)
    reports = ran_as_its_script(sweep, [["x=1"], ["x=2"]])
    assert {r["main_spec"] for r in reports} == {"pkg.trainer"}
    assert {r["argv"][0] for r in reports} == {str(package / "trainer.py")}


def test_two_apps_of_one_file_name_each_see_their_own_script_on_one_warm_ray(
    ray_session: str, tmp_path: Path
) -> None:
    first = _app_copy(tmp_path / "first")
    second = _app_copy(tmp_path / "second", rename=("Model", "Network"))
    for script in (first, second):
        _sweep_succeeds(
            ray_session,
            script.parent / "sweep",
            str(script),
            "--multirun",
            "x=1,2",
            "relaunch=false",
            cwd=script.parent,
        )
    for script, own, other in ((first, "Model", "Network"), (second, "Network", "Model")):
        for num in (0, 1):
            report = _report(script.parent / "sweep" / str(num))
            # The overrides as Hydra's sweeper renders them for the job.
            assert report["argv"] == [str(script), f"x={num + 1}", "relaunch=False"]
            assert own in report["classes"] and other not in report["classes"], report
            assert report["checkpoint"] is True and report["spawn"] == [1, 4, 9], report


def test_a_thin_script_that_imports_its_task_is_still_the_jobs_main_and_argv0(
    ray_session: str, tmp_path: Path
) -> None:
    """`run.py` only imports the app's @hydra.main function from a package and
    calls it (as entry scripts and console scripts do): the jobs still see
    `run.py` as `__main__` and `[run.py, *overrides]` as argv, so Lightning's
    relaunch runs `run.py` with the job's config."""
    _app_copy(tmp_path / "proj")
    (tmp_path / "proj" / "__init__.py").write_text("")
    entry = tmp_path / "run.py"
    entry.write_text('from proj.trainer import main\n\nif __name__ == "__main__":\n    main()\n')
    sweep = tmp_path / "sweep"
    _sweep_succeeds(ray_session, sweep, str(entry), "--multirun", "x=1,2", cwd=tmp_path)
    reports = ran_as_its_script(sweep, [["x=1"], ["x=2"]], defined_in_script=False)
    assert {r["argv"][0] for r in reports} == {str(entry)}


def _report(job_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads((job_dir / "report.json").read_text())
    return report


def test_an_app_edited_after_its_launch_runs_as_launched(tmp_path: Path) -> None:
    """Job x=1 rewrites the script on disk; the later jobs, each in a worker
    process of its own (a runtime_env of its own), still run the source that
    was launched, not the file they would read."""
    script = _app_copy(tmp_path / "app")
    sweep = tmp_path / "sweep"
    res = run_python(
        str(script),
        "--multirun",
        "x=1,2,3",
        "edit_script=true",
        "relaunch=false",
        f"hydra.sweep.dir={sweep}",
        "hydra.launcher.max_concurrent_jobs=1",
        "hydra.launcher.ray.remote.runtime_env={env_vars:{JOB:'job${x}'}}",
        *SMALL_RAY,
        cwd=script.parent,
    )
    assert res.returncode == 0, res.output
    assert '"as edited"' in script.read_text()
    reports = [_report(sweep / str(n)) for n in range(3)]
    assert len({r["pid"] for r in reports}) == 3  # each job in a process of its own
    assert [r["mark"] for r in reports] == ["as launched"] * 3


def test_a_job_runs_as_its_script_would_through_ray_client(tmp_path: Path) -> None:
    client_port = free_port()
    env = {**os.environ, **NO_TOKEN}
    with ray_head(env, client_port=client_port):
        sweep = tmp_path / "sweep"
        res = run_app(
            "trainer.py",
            "x=1,2",
            f"hydra.launcher.ray.init.address=ray://127.0.0.1:{client_port}",
            f"hydra.sweep.dir={sweep}",
            cwd=tmp_path,
            env=NO_TOKEN,
        )
    assert res.returncode == 0, res.output
    reports = ran_as_its_script(sweep, [["x=1"], ["x=2"]])
    assert {r["argv"][0] for r in reports} == {str(TRAINER)}


# What Ray's worker process looks like to `load` (the test's own process stands in).
_APP = '''
"""An app."""
import logging
import hydra
from omegaconf import OmegaConf

OmegaConf.register_new_resolver("triple", lambda x: 3 * int(x))
log = logging.getLogger(__name__)
ran = []


class Thing:
    pass


@hydra.main(version_base=None)
def main(cfg):
    return Thing()


if __name__ == "__main__":
    ran.append("the guard")
if "__main__" == __name__ and True:
    ran.append("a guard written the other way")
elif __name__ != "__main__":
    ran.append("its else")
ran.append("on" if __name__ == "__main__" else "off")
'''


def test_a_script_is_made_the_jobs_main_and_put_back_after(tmp_path: Path) -> None:
    from omegaconf import OmegaConf

    path = tmp_path / "app.py"
    path.write_text(_APP)
    line = next(n for n, text in enumerate(_APP.splitlines(), 1) if text.startswith("@hydra"))
    script = Script(_APP, str(path), None, None, None, None, ("main", line))
    OmegaConf.register_new_resolver("triple", lambda x: 0, replace=True)  # the shipped one
    before_main, before_argv = sys.modules["__main__"], sys.argv
    main = load(script, ["a=1"])
    assert main.module is not None and main.task is not None, main.why
    assert sys.modules["__main__"] is before_main and sys.argv is before_argv
    assert main.module.ran == ["its else", "off"]
    assert main.module.log.name == "__main__"
    assert OmegaConf.create({"a": "${triple:2}"}).a == 6  # the script's own, registered again
    with as_main(main.module, main.path, ["a=2"]):
        assert sys.modules["__main__"] is main.module and sys.argv == [str(path), "a=2"]
        thing = main.task(None)
        assert pickle.loads(pickle.dumps(thing)).__class__ is main.module.Thing
    assert sys.modules["__main__"] is before_main and sys.argv is before_argv
    OmegaConf.clear_resolver("triple")


def test_a_script_whose_code_fails_here_is_said_so_and_left_to_the_shipped_task(
    tmp_path: Path,
) -> None:
    script = Script(
        "import no_such_module\n", str(tmp_path / "a.py"), None, None, None, None, ("main", 1)
    )
    main = load(script, [])
    assert main.module is None and main.task is None
    assert "ModuleNotFoundError" in main.why
    moved = Script(
        "def main(cfg): pass\n", str(tmp_path / "a.py"), None, None, None, None, ("main", 7)
    )
    assert load(moved, []).why == "main is not in it as launched"


def test_only_the_modules_own_tests_of_name_read_it_as_a_child_would() -> None:
    tree = _NotMain().visit(
        ast.parse(
            textwrap.dedent(
                """
                x = __name__
                if __name__ == "__main__": pass
                def f():
                    if __name__ == "__main__": pass
                """
            )
        )
    )
    text = ast.unparse(tree)
    assert "x = __name__" in text and "if '__mp_main__' == '__main__'" in text
    assert "    if __name__ == '__main__'" in text


def test_a_script_that_sync_up_leaves_out_is_named_with_the_include_that_sends_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "src").mkdir()
    path = tmp_path / "src" / "train.py"
    path.write_text("")
    script = Script("", str(path), None, None, None, None, ("main", 1))
    sent = sent_from(script, str(tmp_path), str(tmp_path / "src"))
    assert (sent.sent_as, sent.cwd_sent_as) == ("src/train.py", "src")
    staged = tmp_path / "staged"
    staged.mkdir()
    warning = left_out_warning(sent, staged)
    assert warning is not None and "add 'src/train.py' to hydra.launcher.sync_up.include" in warning
    assert "relaunching the script" in warning
    (staged / "src").mkdir()
    (staged / "src" / "train.py").write_text("")
    assert left_out_warning(sent, staged) is None
    outside = sent_from(script, str(tmp_path / "elsewhere"), str(tmp_path))
    assert (outside.sent_as, outside.cwd_sent_as) == (None, None)
    warning = left_out_warning(outside, None)
    assert warning is not None and "set hydra.launcher.sync_up.source_dir" in warning
    assert left_out_warning(None, None) is None
