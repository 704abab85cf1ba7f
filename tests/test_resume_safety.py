"""A resume never loses a finished job's record: real Hydra apps as
subprocesses, on the test session's real Ray."""

import os
from pathlib import Path

from .conftest import SMALL_RAY, run_app


def test_resume_refuses_a_record_whose_class_is_gone_and_keeps_it(tmp_path: Path) -> None:
    # The jobs return an object of a module that the resume's environment lacks.
    mods = tmp_path / "mods"
    mods.mkdir()
    (mods / "vanished_results.py").write_text(
        "class Result:\n    def __init__(self, x: int):\n        self.x = x\n"
    )
    sweep = tmp_path / "sweep"
    overrides = ["x=1,2", "result_module=vanished_results", f"hydra.sweep.dir={sweep}"]
    # The jobs make the results, the launching process unpickles them: both need
    # the module. A Ray the app starts gives its workers the app's environment.
    env = {"PYTHONPATH": f"{mods}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    first = run_app("app.py", *overrides, *SMALL_RAY, cwd=tmp_path, env=env)
    assert first.returncode == 0, first.output
    records = [sweep / ".hydra_ray" / f"job_{num}.pkl" for num in (0, 1)]
    kept = [path.read_bytes() for path in records]

    (mods / "vanished_results.py").unlink()
    res = run_app(
        "app.py", *overrides, *SMALL_RAY, "hydra.launcher.resume=true", cwd=tmp_path, env=env
    )
    assert res.returncode != 0
    assert "hydra.launcher.resume=true refused: 2 job records" in res.output
    for path in records:
        assert f"{path}: ModuleNotFoundError: No module named 'vanished_results'" in res.output
    assert "mv -n" in res.output
    # Refused before anything ran, and the records are as the first run left them.
    assert "Initializing ray" not in res.output
    assert [path.read_bytes() for path in records] == kept
    assert [len((sweep / str(n) / f"runs_{n}").read_text().splitlines()) for n in (0, 1)] == [1, 1]
