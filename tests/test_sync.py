"""The rsync command lines that filter sync_up/sync_down, run for real between
two local directories."""

import subprocess
from pathlib import Path

from hydra_ray.infra.sync import rsync_command


def _tree(root: Path, *files: str) -> Path:
    for name in files:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    return root


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def _dirs(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_dir()}


def _rsync(source: Path, target: Path, include: list[str], exclude: list[str]) -> None:
    target.mkdir(exist_ok=True)
    subprocess.run(
        rsync_command(f"{source}/", f"{target}/", include=include, exclude=exclude),
        check=True,
    )


def test_sync_up_example_uploads_the_model_package_and_the_top_level_scripts(
    tmp_path: Path,
) -> None:
    # examples/upload_download: include ['model', '*.py'], exclude ['*'].
    app = _tree(
        tmp_path / "app",
        "model/__init__.py",
        "model/my_model.py",
        "model/weights/init.bin",
        "train.py",
        "config.yaml",
        "data/x.bin",
        "data/helper.py",
    )
    _rsync(app, tmp_path / "up", include=["model", "*.py"], exclude=["*"])
    assert _files(tmp_path / "up") == {
        "model/__init__.py",
        "model/my_model.py",
        "model/weights/init.bin",
        "train.py",
    }


def test_sync_down_example_brings_back_every_checkpoint_and_only_the_dirs_to_them(
    tmp_path: Path,
) -> None:
    # examples/upload_download: include ['*.pt', '*/'], exclude ['*'].
    sweep = _tree(
        tmp_path / "sweep",
        "multirun.yaml",
        *(f"{n}/.hydra/config.yaml" for n in range(3)),
        *(f"{n}/train.log" for n in range(3)),
        *(f"{n}/checkpoint/checkpoint_{n + 1}.pt" for n in range(3)),
    )
    _rsync(sweep, tmp_path / "down", include=["*.pt", "*/"], exclude=["*"])
    down = tmp_path / "down"
    assert _files(down) == {f"{n}/checkpoint/checkpoint_{n + 1}.pt" for n in range(3)}
    # No empty .hydra dirs are left behind by the filter.
    assert _dirs(down) == {"0", "1", "2", "0/checkpoint", "1/checkpoint", "2/checkpoint"}


def test_an_include_path_reaches_inside_the_directories_leading_to_it(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", "lib/model/net.py", "lib/model/sub/x.py", "lib/other.py", "a.py")
    _rsync(src, tmp_path / "out", include=["lib/model"], exclude=["*"])
    assert _files(tmp_path / "out") == {"lib/model/net.py", "lib/model/sub/x.py"}


def test_without_patterns_everything_is_copied_empty_dirs_too(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", "a/b.txt", ".hidden", "c.py")
    (src / "empty").mkdir()
    _rsync(src, tmp_path / "out", include=[], exclude=[])
    assert _files(tmp_path / "out") == {"a/b.txt", ".hidden", "c.py"}
    assert (tmp_path / "out" / "empty").is_dir()


def test_excludes_alone_leave_out_what_they_match(tmp_path: Path) -> None:
    src = _tree(tmp_path / "src", "train.py", "outputs/run.log", "model/m.py", "model/m.pyc")
    _rsync(src, tmp_path / "out", include=[], exclude=["outputs", "*.pyc"])
    assert _files(tmp_path / "out") == {"train.py", "model/m.py"}
