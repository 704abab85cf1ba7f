"""The cluster launcher end to end, as a user runs it: `python app.py --multirun
...` creates a Ray cluster on fake on-prem hosts (a head and a worker, each with
its own filesystem, over ssh), runs the sweep there, brings the outputs home and
tears the cluster down."""

import json
import re
import secrets
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from hydra_ray.core.redact import HIDDEN

from ..cluster_harness.fake_hosts import (
    FakeHosts,
    launcher_env,
    ssh_control_dir,
    thread_pool_teardown_env,
    unique_cluster_name,
)
from ..conftest import AppProcess, run_in_pty
from ..real_code import ran_as_its_script

REPO = Path(__file__).parents[2]
EXAMPLE = REPO / "examples" / "upload_download"


def _cluster_yaml(hosts: FakeHosts, tmp_path: Path, prefix: str, *, named: bool = True) -> Path:
    """A provider-local cluster whose head runs no jobs (0 CPUs): every job runs on
    the worker, so its outputs exist only on the worker's disk. Not `named`: the
    launcher names it."""
    config = hosts.local_cluster_config(
        unique_cluster_name(prefix),
        num_cpus=2,
        head_args=["--num-cpus=0", "--include-dashboard=false"],
    )
    if not named:
        del config["cluster_name"]
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _run(
    hosts: FakeHosts,
    tmp_path: Path,
    cwd: Path,
    *args: str,
    env: Mapping[str, str] | None = None,
) -> Any:
    # The fake hosts share this machine's Python: no conda env to create there.
    return hosts.run_in_netns(
        [sys.executable, *args, "hydra.launcher.env_setup.commands=[]"],
        env=launcher_env(tmp_path, env),
        cwd=cwd,
        timeout=600,
    )


class NetnsApp(AppProcess):
    """`python SCRIPT --multirun ARGS` of tests/apps (copied to tmp_path/app) started
    as `AppProcess` in the fake hosts' netns, as `_run` runs it (`env`: more of the
    launching process's environment)."""

    def __init__(
        self,
        hosts: FakeHosts,
        tmp_path: Path,
        *args: str,
        script: str = "app.py",
        env: Mapping[str, str] | None = None,
    ) -> None:
        app = tmp_path / "app"
        shutil.copytree(REPO / "tests" / "apps", app)
        self.tmp_path = tmp_path
        super().__init__(
            [
                *hosts.netns_prefix(),
                sys.executable,
                script,
                "--multirun",
                *args,
                "hydra.launcher.env_setup.commands=[]",
            ],
            cwd=app,
            env=launcher_env(tmp_path, env),
        )

    # Longer than for a local Ray: a cluster is created (and torn down) on the way.
    def wait_for(self, text: str, timeout: float = 240) -> None:
        super().wait_for(text, timeout)

    def wait(self, timeout: float = 240) -> int:
        return super().wait(timeout)

    @property
    def story(self) -> str:
        """Our lines (the launcher's and the head driver's) and Python's errors,
        without Ray's and pip's: what an assertion message can show whole."""
        return "".join(
            line
            for line in self.lines
            if "[HYDRA]" in line or "Error" in line or line.startswith("Traceback")
        )


def _run_test_app(
    hosts: FakeHosts,
    tmp_path: Path,
    cluster_yaml: Path,
    *overrides: str,
    env: Mapping[str, str] | None = None,
    sweep_dir: str | None = None,
) -> Any:
    """`python app.py --multirun OVERRIDES` (tests/apps, run in tmp_path/app) on the
    cluster of `cluster_yaml`, with its sweep dir at tmp_path/sweep, named
    `sweep_dir` if given (`env`: more of the launching process's environment)."""
    app = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app)
    return _run(
        hosts,
        tmp_path,
        app,
        "app.py",
        "--multirun",
        *overrides,
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={cluster_yaml}",
        f"hydra.sweep.dir={sweep_dir or tmp_path / 'sweep'}",
        env=env,
    )


def _sync_overrides() -> list[str]:
    """The example's own sync_up/sync_down settings, as overrides of ray_cluster."""
    example = OmegaConf.to_container(
        OmegaConf.load(EXAMPLE / "hydra" / "launcher" / "custom_ray_aws.yaml")
    )
    assert isinstance(example, dict)
    overrides = []
    for section in ("sync_up", "sync_down"):
        for key, value in example[section].items():
            if isinstance(value, list):
                rendered = "[" + ",".join(f"'{v}'" for v in value) + "]"
            else:
                rendered = "null" if value is None else f"'{value}'"
            overrides.append(f"hydra.launcher.{section}.{key}={rendered}")
    return overrides


def _no_leftovers(hosts: FakeHosts, sweep: Path | None = None) -> None:
    """No temp dir, no Ray process and no watchdog left on the hosts; and no `sweep` (an absolute
    sweep dir, a path of the launching machine: the cluster keeps it in its temp dir)."""
    for host in ("head", "worker"):
        assert list(hosts.host_path(host, "/tmp").glob("hydra-ray-*")) == [], host
        assert hosts.wait_no_ray_processes(host, timeout=60) == [], host
        # The autodown watchdog: disarmed before the launcher's own teardown.
        assert [p for p in hosts.processes(host) if "autodown" in p.cmdline] == [], host
        if sweep is not None:
            assert not hosts.host_path(host, sweep).exists(), host


def test_upload_download_example_brings_every_checkpoint_home(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    app = tmp_path / "app"
    shutil.copytree(EXAMPLE, app)
    sweep = tmp_path / "sweep"
    res = _run(
        fake_hosts,
        tmp_path,
        app,
        "train.py",
        "--multirun",
        "random_seed=1,2,3",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(fake_hosts, tmp_path, 'ud')}",
        f"hydra.sweep.dir={sweep}",
        *_sync_overrides(),
    )
    assert res.returncode == 0, res.stdout
    for num, seed in enumerate([1, 2, 3]):
        assert (sweep / str(num) / "checkpoint" / f"checkpoint_{seed}.pt").is_file()
        # sync_down's include/exclude kept everything else on the cluster.
        assert not (sweep / str(num) / ".hydra").exists()
        assert f"#{num} : random_seed={seed} succeeded" in res.stdout
    assert "on 127.0.0.3" in res.stdout  # the jobs ran on the worker
    assert "Stopping cluster" in res.stdout
    _no_leftovers(fake_hosts)


# Secrets a user puts in a sweep, which must reach the jobs and Ray (inside
# the 0600 job spec) and nothing else: no log line, no file but the records
# and the job spec (0600), no process's command line here or on the hosts.
SECRETS = {"override": "tok-s3cr3t-7f3a", "env var": "env-s3cr3t-91c2"}


class CommandLines:
    """Every process's command line seen on this machine while in the `with`
    block: the fake hosts' processes are in PID namespaces below this one's,
    so /proc here shows them too."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.1):
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(
                        cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
                    )
                except OSError:
                    continue

    def __enter__(self) -> "CommandLines":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def _no_secret_anywhere(output: str, sweep: Path, argv: CommandLines) -> None:
    """Not in the output (but Hydra's own line that quotes a failed job's
    overrides as the user typed them), not in any command line (but the one the
    user typed), not in the plugin's files that are not 0600."""
    hydras = "Error executing job with overrides:"
    found = [
        line
        for line in output.splitlines()
        if any(v in line for v in SECRETS.values()) and hydras not in line
    ]
    assert not found, found
    typed = "app.py --multirun"
    # Ray's own: it starts each worker with its runtime_env, env_vars and all,
    # on setup_worker.py's command line (docs/configuration.md says so).
    rays = "ray/_private/workers/setup_worker.py"
    found = [
        line
        for line in argv.seen
        if typed not in line
        and (SECRETS["override"] in line or (SECRETS["env var"] in line and rays not in line))
    ]
    assert not found, found
    # Hydra's own files (.hydra/, multirun.yaml) hold the config as the user wrote it.
    # The records and the manifest hold the jobs' overrides as run: 0600.
    private = [*(sweep / ".hydra_ray").glob("job_*.pkl"), sweep / ".hydra_ray" / "sweep.json"]
    for path in private:
        assert path.stat().st_mode & 0o077 == 0, path
    for path in [sweep / "sweep_summary.json", *(sweep / ".hydra_ray").glob("*.json")]:
        if path not in private:
            text = path.read_text()
            assert not any(v in text for v in SECRETS.values()), path
    assert (sweep / ".hydra" / "ray_cluster.yaml").stat().st_mode & 0o077 == 0


def test_every_job_output_dir_comes_home_from_a_cluster_named_for_the_multirun(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """A failed job's dir too. Also: a cluster whose config names none gets a name
    unique to the multirun, and is torn down while Python is fully alive (at once on
    the failure), also when Ray's teardown uses a thread pool, as it does for docker
    (teardown at the multirun's end: the batched sweeper's test). The sweep dir
    leads out of the app's dir (`../sweep`): on the nodes it stays in the launch's
    temp dir, and the summary names where the jobs' dirs came home. A token
    override and an env var for the jobs appear in no log line, no file but the
    0600 ones, and no command line here or on the hosts."""
    failing = True
    sweep = tmp_path / "sweep"
    with CommandLines() as argv:
        res = _run_test_app(
            fake_hosts,
            tmp_path,
            _cluster_yaml(fake_hosts, tmp_path, "all", named=False),
            "x=1,2,3",
            "seconds=1",
            f"raise_on={[2] if failing else []}",
            f"+api_token={SECRETS['override']}",
            f"+hydra.launcher.ray.init.runtime_env.env_vars.APP_SECRET={SECRETS['env var']}",
            env=thread_pool_teardown_env(),
            sweep_dir="../sweep",
        )
    named = re.search(r"Creating or updating cluster '(hydra-app-[0-9a-f]{8})'", res.stdout)
    assert named, res.stdout
    shutil.rmtree(ssh_control_dir(named.group(1)), ignore_errors=True)
    assert (res.returncode != 0) == failing, res.stdout
    written = yaml.safe_load((sweep / ".hydra" / "ray_cluster.yaml").read_text())
    assert written["cluster_name"] == named.group(1)
    for num in range(3):
        job_dir = sweep / str(num)
        assert (job_dir / ".hydra" / "config.yaml").is_file()
        assert (job_dir / "app.log").is_file()
        assert (job_dir / f"done_{num}.json").is_file() == (failing is False or num != 1)
    summary = json.loads((sweep / "sweep_summary.json").read_text())
    assert [j["output_dir"] for j in summary["jobs"]] == [str(sweep / str(n)) for n in range(3)]
    if failing:
        assert "ValueError: job 1 was told to raise" in res.stdout
    assert "Stopping cluster" in res.stdout
    assert "cannot schedule new futures" not in res.stdout
    assert "Deleted the cluster" in res.stdout
    _no_leftovers(fake_hosts, Path("/tmp/sweep"))  # not beside the temp dir either
    # Secrets given to the jobs reached nothing else (the job listing shows the
    # override hidden).
    assert f"api_token={HIDDEN}" in res.stdout, res.stdout
    _no_secret_anywhere(res.stdout, sweep, argv)


def test_a_job_whose_own_config_asks_for_a_resource_only_the_worker_has_runs_there(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """hydra.launcher.ray.remote interpolates into each job's config, resolved
    per job by the driver on the head: the `large` job asks for 2 CPUs and a
    "disk", which only the worker has; the `small` one for 1 CPU."""
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("rsc"),
        num_cpus=2,
        worker_resources={"disk": 1},
        head_args=["--include-dashboard=false"],
    )
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(config))
    app = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app)
    res = _run(
        fake_hosts,
        tmp_path,
        app,
        "resources_app.py",
        "--multirun",
        "model=small,large",
        "hydra.launcher.ray.remote.num_gpus=0",  # no GPU on these hosts
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={cluster_yaml}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    )
    assert res.returncode == 0, res.stdout
    sweep = tmp_path / "sweep"
    got = [json.loads((sweep / str(n) / "resources.json").read_text()) for n in range(2)]
    assert [g["assigned"] for g in got] == [{"CPU": 1.0}, {"CPU": 2.0, "disk": 1.0}]
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert jobs[1]["node"] == fake_hosts.address("worker"), res.stdout
    assert "with {CPU: 2, disk: 1}" in res.stdout
    _no_leftovers(fake_hosts)


def test_a_job_on_a_worker_node_runs_as_its_script_would(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """The script and its config go with sync_up; the jobs run on the worker,
    whose disk has none of this machine's paths: each job's argv, __main__ and
    original cwd are their copies there, and Lightning's relaunch works."""
    cluster_yaml = _cluster_yaml(fake_hosts, tmp_path, "scr")
    app = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app)
    sweep = tmp_path / "sweep"
    res = _run(
        fake_hosts,
        tmp_path,
        app,
        "trainer.py",
        "--multirun",
        "x=1,2",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={cluster_yaml}",
        f"hydra.sweep.dir={sweep}",
        "hydra.launcher.sync_up.source_dir=.",
        "hydra.launcher.sync_up.include=['trainer.py','trainer.yaml']",
        "hydra.launcher.sync_up.exclude=['*']",
    )
    assert res.returncode == 0, res.stdout
    assert "is not in what hydra.launcher.sync_up sends" not in res.stdout
    reports = ran_as_its_script(sweep, [["x=1"], ["x=2"]])
    jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
    assert {j["node"] for j in jobs} == {fake_hosts.address("worker")}
    for report in reports:
        script = Path(report["argv"][0])
        assert script.name == "trainer.py" and not script.is_relative_to(tmp_path), report
        assert report["original_cwd"] == str(script.parent), report
    _no_leftovers(fake_hosts, sweep)


def test_resume_on_a_cluster_runs_only_what_did_not_succeed(
    fake_hosts: FakeHosts, tmp_path: Path
) -> None:
    """The jobs' records come home with the outputs (even when sync_down's filters
    leave them out), and a resume decides here, from them, what the next cluster runs."""
    counters = f"/tmp/app-counters-{secrets.token_hex(4)}"  # on the worker, outside any sweep
    overrides = [
        "x=1,2,3",
        "fail_first=[2]",  # job #1 raises on its first run only
        f"out={counters}",
        "hydra.launcher.sync_down.exclude=['.hydra_ray']",
    ]
    cluster_yaml = _cluster_yaml(fake_hosts, tmp_path, "res")
    sweep = tmp_path / "sweep"
    try:
        first = _run_test_app(fake_hosts, tmp_path, cluster_yaml, *overrides)
        assert first.returncode != 0, first.stdout
        # The head driver's progress lines reach the user's output as the jobs run.
        assert "#1 : x=2 fail_first=[2]" in first.stdout and "started on 127.0.0.3" in first.stdout
        assert (sweep / ".hydra_ray" / "job_0.pkl").is_file()
        summary = json.loads((sweep / "sweep_summary.json").read_text())
        assert [j["status"] for j in summary["jobs"]] == ["succeeded", "failed", "succeeded"]

        shutil.rmtree(tmp_path / "app")
        second = _run_test_app(
            fake_hosts, tmp_path, cluster_yaml, *overrides, "hydra.launcher.resume=true"
        )
        assert second.returncode == 0, second.stdout
        assert "Resuming: 2 of 3 jobs succeeded in the earlier run" in second.stdout
        assert "#0 : x=1" not in second.stdout.split("Resuming:")[1]
        runs = [
            len(fake_hosts.host_path("worker", f"{counters}/runs_{n}").read_text().splitlines())
            for n in range(3)
        ]
        assert runs == [1, 2, 1]
        jobs = json.loads((sweep / "sweep_summary.json").read_text())["jobs"]
        assert [(j["status"], j["resumed"]) for j in jobs] == [
            ("succeeded", True),
            ("succeeded", False),
            ("succeeded", True),
        ]
        assert [j["return_value"] for j in jobs] == [10, 20, 30]
    finally:
        shutil.rmtree(fake_hosts.host_path("worker", counters), ignore_errors=True)
    _no_leftovers(fake_hosts)


@pytest.fixture
def token_cluster_yaml(fake_hosts: FakeHosts, tmp_path: Path) -> Iterator[Path]:
    """A cluster with Ray 2.60 token auth on every node (the token shipped with
    file_mounts, as Ray's docs describe)."""
    token = tmp_path / "auth_token"
    token.write_text(secrets.token_hex(32))
    config = fake_hosts.local_cluster_config(
        unique_cluster_name("tok"),
        num_cpus=2,
        auth_mode="token",
        head_args=["--num-cpus=0", "--include-dashboard=false"],
    )
    config["file_mounts"] = {"/root/.ray/auth_token": str(token)}
    cluster_yaml = tmp_path / "cluster.yaml"
    cluster_yaml.write_text(yaml.safe_dump(config))
    yield cluster_yaml
    # The hosts outlive this test: a token left there would be picked up by the
    # drivers of the token-less clusters of later tests.
    for host in ("head", "worker"):
        fake_hosts.host_path(host, "/root/.ray/auth_token").unlink(missing_ok=True)


def test_live_display_of_the_head_reaches_the_users_terminal_from_a_token_cluster(
    fake_hosts: FakeHosts, tmp_path: Path, token_cluster_yaml: Path
) -> None:
    """On a cluster with token auth (one cluster for both, to keep the suite short):
    the driver on the head connects (address="auto" finds the head's token) and
    the jobs run on the worker."""
    app = tmp_path / "app"
    shutil.copytree(REPO / "tests" / "apps", app)
    cmd = [*fake_hosts.netns_prefix(), sys.executable, "app.py", "--multirun", "x=1,2,3"]
    cmd += [
        "seconds=1.5",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={token_cluster_yaml}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        "hydra.launcher.env_setup.commands=[]",
    ]
    res = run_in_pty(cmd, cwd=app, env=launcher_env(tmp_path), timeout=600)
    assert res.returncode == 0, res.output
    for num in range(3):
        assert (tmp_path / "sweep" / str(num) / f"done_{num}.json").is_file()
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", res.output)
    # Drawn on the head, redrawn in place on this terminal, through ssh.
    assert "\x1b[1A" in res.output and "\x1b[2K" in res.output
    # Several stages of the sweep, as they came (jobs ending together share one).
    stages = set(re.findall(r"(\d)/3 jobs · (\d) running · (\d) queued", plain))
    assert {("0", "0", "3"), ("3", "0", "0")} < stages, stages
    assert re.search(r"#\d : x=\d seconds=1.5 started on 127.0.0.3", plain)
    assert "3/3 jobs · 0 running · 0 queued · 3 succeeded · 0 failed" in plain
    # The summary table, drawn here.
    assert re.search(r"#\s+overrides\s+status\s+duration\s+attempts\s+node\s+error", plain)
    _no_leftovers(fake_hosts)
