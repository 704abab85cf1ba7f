"""rsync and ssh command lines of sync_up/sync_down, run for real: rsync between
two local directories (and through a stand-in remote shell), ssh parsing its options."""

import subprocess
from pathlib import Path

import pytest

from hydra_plugins.hydra_ray_launcher._sync import (
    ray_ssh_control_dir,
    remote_path,
    rsync_command,
    ssh_command,
)


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
        rsync_command(f"{source}/", f"{target}/", include=include, exclude=exclude, ssh=None),
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


def test_rsync_goes_through_the_given_remote_shell_to_user_at_host(tmp_path: Path) -> None:
    # A stand-in for ssh: drops rsync's `-l USER HOST` and runs the remote side
    # here. Its name has spaces and quotes, as a ProxyCommand option would.
    calls = tmp_path / "calls"
    shell = [
        "bash",
        "-c",
        f'echo "$@" >> {calls}; shift 3; exec "$@"',
        'fake ssh\'s "remote" shell',
    ]
    src = _tree(tmp_path / "src", "train.py", "model/m.py", "notes.txt")
    (tmp_path / "remote").mkdir()
    cmd = rsync_command(
        str(src),
        remote_path("ubuntu", "10.0.0.5", f"{tmp_path / 'remote'}/"),
        include=["model", "*.py"],
        exclude=["*"],
        ssh=shell,
    )
    subprocess.run(cmd, check=True)
    assert _files(tmp_path / "remote") == {"train.py", "model/m.py"}
    assert calls.read_text().startswith("-l ubuntu 10.0.0.5 rsync --server")


def test_remote_path_names_a_path_on_a_node() -> None:
    assert remote_path("ubuntu", "10.0.0.5", "/tmp/x/") == "ubuntu@10.0.0.5:/tmp/x/"
    assert remote_path("ray", "fe80::1", "/tmp") == "ray@[fe80::1]:/tmp"


def test_ssh_command_has_the_options_of_rays_own_ssh(tmp_path: Path) -> None:
    from ray.autoscaler._private.command_runner import SSHCommandRunner

    auth = {
        "ssh_user": "ubuntu",
        "ssh_private_key": str(tmp_path / "key.pem"),
        "ssh_proxy_command": "nc -x proxy.example.com:1080 %h %p",
    }
    cluster_name = f"hydra-test-sync-{tmp_path.name}"
    ray_runner = SSHCommandRunner(  # type: ignore[no-untyped-call]
        "", "node", None, auth, cluster_name, subprocess, use_internal_ip=False
    )
    try:
        ours = ssh_command(auth, cluster_name=cluster_name)
        rays = ray_runner.ssh_options.to_ssh_options_list(timeout=120)  # type: ignore[no-untyped-call]
        assert ours == ["ssh", *rays]
        # Ray's ControlMaster sockets are shared: ssh needs their directory to exist.
        control_dir = Path(ray_ssh_control_dir(cluster_name))
        assert control_dir.is_dir() and control_dir.stat().st_mode & 0o777 == 0o700
    finally:
        Path(ray_ssh_control_dir(cluster_name)).rmdir()


def test_ssh_accepts_the_options_it_is_given(tmp_path: Path) -> None:
    auth = {"ssh_user": "ubuntu", "ssh_proxy_command": "nc -x proxy.example.com:1080 %h %p"}
    # `ssh -G` parses every option and prints the result without connecting.
    out = subprocess.run(
        [*ssh_command(auth, timeout=7), "-G", "ubuntu@10.0.0.5"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    settings = dict(line.split(" ", 1) for line in out.splitlines())
    assert settings["user"] == "ubuntu" and settings["hostname"] == "10.0.0.5"
    assert settings["stricthostkeychecking"] == "false"
    assert settings["userknownhostsfile"] == "/dev/null"
    assert settings["proxycommand"] == "nc -x proxy.example.com:1080 %h %p"
    assert settings["connecttimeout"] == "7"
    # No cluster name: no shared connection.
    assert settings.get("controlmaster", "false") == "false"


def test_a_private_key_path_with_a_tilde_is_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/alice")
    argv = ssh_command({"ssh_user": "u", "ssh_private_key": "~/.ssh/ray.pem"})
    assert argv[:3] == ["ssh", "-i", "/home/alice/.ssh/ray.pem"]
    assert "-i" not in ssh_command({"ssh_user": "u"})
