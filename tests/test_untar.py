"""Archives from a cluster or a storage land only inside their target, on every
Python this plugin supports (the smoke stage runs this on 3.10, 3.12 and 3.13)."""

import io
import tarfile
from pathlib import Path

import pytest

from hydra_ray.core.errors import UnsafeArchive
from hydra_ray.core.untar import extract_within


def _tar(path: Path, *members: tuple[str, str, str]) -> Path:
    """A tar of (kind, name, content or link target) members: file, dir, sym, link."""
    with tarfile.open(path, "w") as tar:
        for kind, name, value in members:
            info = tarfile.TarInfo(name)
            data = b""
            if kind == "file":
                data = value.encode()
                info.size = len(data)
            elif kind == "dir":
                info.type = tarfile.DIRTYPE
            elif kind == "fifo":
                info.type = tarfile.FIFOTYPE
            else:
                info.type = tarfile.SYMTYPE if kind == "sym" else tarfile.LNKTYPE
                info.linkname = value
            tar.addfile(info, io.BytesIO(data))
    return path


def _extract(archive: Path, target: Path) -> None:
    with tarfile.open(archive) as tar:
        extract_within(tar, target, source="a test")


@pytest.mark.parametrize(
    "bad",
    [
        ("file", "../escaped", "x"),
        ("file", "0/../../escaped", "x"),
        ("link", "0/hard", "../escaped"),
        ("fifo", "0/pipe", ""),
    ],
)
def test_a_member_that_would_land_outside_refuses_the_whole_archive(
    tmp_path: Path, bad: tuple[str, str, str]
) -> None:
    target = tmp_path / "sweep"
    archive = _tar(tmp_path / "a.tar", ("file", "0/result.txt", "ok"), bad)
    with pytest.raises(UnsafeArchive, match="nothing of it was extracted") as exc:
        _extract(archive, target)
    assert repr(bad[1]) in str(exc.value)
    assert not (tmp_path / "escaped").exists()
    assert not (target / "0" / "result.txt").exists()


def test_an_absolute_member_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    archive = _tar(tmp_path / "a.tar", ("file", str(outside), "x"))
    with pytest.raises(UnsafeArchive):
        _extract(archive, tmp_path / "sweep")
    assert not outside.exists()


def test_a_link_out_of_the_target_is_left_out_and_nothing_is_written_through_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    outside = tmp_path / "home"
    outside.mkdir()
    target = tmp_path / "sweep"
    archive = _tar(
        tmp_path / "a.tar",
        ("sym", "0/data", str(outside)),
        ("file", "0/data/authorized_keys", "attacker"),
        ("file", "0/ckpt_5.pt", "weights"),
        ("sym", "0/latest.pt", "ckpt_5.pt"),
    )
    _extract(archive, target)
    assert list(outside.iterdir()) == []
    assert not (target / "0" / "data").is_symlink()
    assert (target / "0" / "latest.pt").is_symlink()  # a link inside: as the job wrote it
    assert (target / "0" / "latest.pt").read_text() == "weights"
    assert f"0/data -> {outside}" in caplog.text
