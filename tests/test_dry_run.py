"""`hydra.launcher.dry_run=true`, as a user runs it before spending: the plan
printed, every problem listed at once with its key, nothing started (no Ray, no
cluster, no upload, no record), exit 0 only when the plan holds. The AWS checks
run against moto, on loopback: EC2's DryRun says whether the node types may launch."""

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hydra_ray.launch.plan import ec2_dry_run_refusal

from .cluster_harness.moto import MotoServer, moto_server
from .conftest import AppRun, processes_in_session, run_app, start_app

DRY = "hydra.launcher.dry_run=true"
MOTO_AMI = "ami-12c6146b"  # one of the images moto knows


def _dry_run(*overrides: str, cwd: Path, env: dict[str, str] | None = None) -> AppRun:
    """The app in a session of its own; after it exits, nothing of that session lives."""
    with start_app("app.py", *overrides, cwd=cwd, env=env) as run:
        code = run.wait(timeout=120)
        left = processes_in_session(run.pid)
        assert left == [], "\n".join(left)
    return AppRun(code, run.output)


def _nothing_written(sweep: Path) -> None:
    """No job ran and no record was written; Hydra itself writes multirun.yaml."""
    assert sorted(p.name for p in sweep.iterdir()) == ["multirun.yaml"], list(sweep.iterdir())


def test_a_valid_sweep_on_the_local_ray_prints_the_plan_and_starts_nothing(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "sweep"
    res = _dry_run(
        "x=1,2,3",
        "hydra.launcher.ray.remote.num_cpus=1",
        "hydra.launcher.job_timeout_s=30",
        f"hydra.sweep.dir={sweep}",
        DRY,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    out = res.output
    assert "Dry run of the ray launcher: nothing was started" in out
    assert "3 jobs (each config composed and resolved)" in out
    for num, x in enumerate([1, 2, 3]):
        assert f"#{num} : x={x} -> {sweep / str(num)}" in out
    assert "num_cpus=1" in out and "job_timeout_s: 30 s" in out
    assert f"this machine's Ray: {os.cpu_count()} CPUs" in out
    assert "Dry run: the plan holds" in out
    assert "Initializing ray" not in out and "Started a local Ray" not in out
    _nothing_written(sweep)


def test_every_problem_of_a_local_sweep_is_listed_at_once(tmp_path: Path) -> None:
    res = _dry_run(
        "x=1,2,${nope}",  # job #2's x cannot resolve
        "+hydra.launcher.ray.remote.num_cpu=1",  # a typo of num_cpus
        "hydra.launcher.retries=-1",
        f"hydra.launcher.ray.init.num_cpus={2}",
        "hydra.launcher.ray.remote.memory=1000000000000000",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        DRY,
        cwd=tmp_path,
    )
    assert res.returncode != 0, res.output
    problems = res.output.split("problems would stop this sweep:", 1)[1]
    assert "Dry run: 4 problems" in res.output, res.output
    assert "job #2 (x=" in problems and "x does not resolve" in problems
    assert "hydra.launcher.ray.remote is not valid for ray.remote()" in problems
    assert "num_cpu " in problems
    assert "hydra.launcher.retries=-1 is not valid" in problems
    assert "hydra.launcher.ray.remote.memory=1000000000000000" in problems
    _nothing_written(tmp_path / "sweep")
    # The real run refuses the two bad keys together, before Ray starts.
    real = _dry_run(
        "x=1",
        "+hydra.launcher.ray.remote.num_cpu=1",
        "hydra.launcher.retries=-1",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert real.returncode != 0, real.output
    assert "hydra.launcher.retries=-1 is not valid" in real.output
    assert "hydra.launcher.ray.remote is not valid for ray.remote()" in real.output
    assert "Initializing ray" not in real.output
    _nothing_written(tmp_path / "sweep")


def test_a_dry_run_of_a_resume_says_which_jobs_would_run_and_changes_nothing(
    tmp_path: Path, ray_session: str
) -> None:
    sweep = tmp_path / "sweep"
    common = ["x=1,2", "raise_on=[2]", f"hydra.sweep.dir={sweep}"]
    first = run_app(
        "app.py", *common, f"hydra.launcher.ray.init.address={ray_session}", cwd=tmp_path
    )
    assert first.returncode != 0, first.output  # job #1 raised
    before = {p: p.stat().st_mtime_ns for p in sweep.rglob("*")}
    res = _dry_run(*common, "hydra.launcher.resume=true", DRY, cwd=tmp_path)
    assert res.returncode == 0, res.output
    assert "succeeded earlier, not run again: #0" in res.output
    assert "to run: 1" in res.output
    assert {p: p.stat().st_mtime_ns for p in sweep.rglob("*")} == before | {
        sweep / "multirun.yaml": (sweep / "multirun.yaml").stat().st_mtime_ns
    }


# ---- The cluster launchers: nothing is contacted, so no fake hosts are needed.


def _cluster_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "cluster_name: dry\n"
        "provider: {type: local, head_ip: 127.0.0.9, worker_ips: [127.0.0.10]}\n"
        "auth: {ssh_user: nobody, ssh_private_key: /nonexistent/key}\n"
    )
    return path


def test_a_cluster_dry_run_shows_the_cluster_and_what_would_be_uploaded(tmp_path: Path) -> None:
    code = tmp_path / "code"
    (code / "model").mkdir(parents=True)
    (code / "train.py").write_text("print('train')\n")
    (code / "model" / "net.py").write_text("x = 1\n" * 1000)
    (code / "data.bin").write_bytes(b"\0" * 300_000)
    sweep = tmp_path / "sweep"
    res = _dry_run(
        "x=1,2",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(tmp_path)}",
        f"hydra.launcher.sync_up.source_dir={code}",
        "hydra.launcher.sync_up.exclude=[*.bin]",
        "hydra.launcher.env_setup.commands=[echo set-up]",
        f"hydra.sweep.dir={sweep}",
        DRY,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.output
    out = res.output
    assert "Dry run of the ray_cluster launcher" in out
    assert "name: dry; provider: local" in out
    assert "head: 127.0.0.9; workers: ['127.0.0.10']" in out
    head = out.split("Commands on the head, in the order they run:", 1)[1]
    assert head.index("echo set-up") < head.index("pip install") < head.index("ray start --head")
    # The real run's filter: the .bin file stays home.
    assert f"sync_up: 2 files, 5.9 KiB from {code}" in out, out
    assert "model/net.py" in out and "data.bin" not in out
    assert "The cluster config Ray would get:" in out and "ssh_user: nobody" in out
    assert "Creating or updating cluster" not in out
    _nothing_written(sweep)


def test_three_mistakes_are_listed_in_one_dry_run_and_the_real_run_refuses_before_a_cluster(
    tmp_path: Path,
) -> None:
    mistakes = [
        "x=1,2,${nope}",
        "+hydra.launcher.ray.remote.num_gpu=1",
        f"hydra.launcher.sync_up.source_dir={tmp_path / 'no-such-dir'}",
        "hydra/launcher=ray_cluster",
        f"hydra.launcher.cluster_yaml={_cluster_yaml(tmp_path)}",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
    ]
    res = _dry_run(*mistakes, DRY, cwd=tmp_path)
    assert res.returncode != 0, res.output
    assert "Dry run: 3 problems would stop this sweep" in res.output, res.output
    assert "job #2 (x=" in res.output
    assert "hydra.launcher.ray.remote is not valid for ray.remote()" in res.output
    assert "hydra.launcher.sync_up.source_dir=" in res.output
    real = _dry_run(*mistakes, cwd=tmp_path)
    assert real.returncode != 0, real.output
    assert "hydra.launcher.ray.remote is not valid for ray.remote()" in real.output
    assert "hydra.launcher.sync_up.source_dir=" in real.output
    assert "Creating or updating cluster" not in real.output
    assert "Pickle for jobs" not in real.output


# ---- AWS, against moto on loopback.


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    # In pytest's temp dir (which pytest prunes), not a /tmp dir of its own.
    with moto_server(tmp_path_factory.mktemp("moto-home")) as server:
        yield server


def _ec2(moto: MotoServer) -> Any:
    return moto.client("ec2")


def _aws_dry_run(moto: MotoServer, tmp_path: Path, *overrides: str) -> AppRun:
    return _dry_run(
        "x=1,2",
        "hydra/launcher=ray_aws",
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        *overrides,
        DRY,
        cwd=tmp_path,
        env=moto.env,
    )


def _node_types(head: tuple[str, str], worker: tuple[str, str]) -> str:
    """available_node_types with these (image, instance type), as a user overrides it."""

    def node(image: str, kind: str, counts: str = "") -> str:
        return f"{{{counts}resources:{{}},node_config:{{InstanceType:{kind},ImageId:{image}}}}}"

    return (
        "hydra.launcher.ray.cluster.available_node_types={"
        f"ray.head.default:{node(*head)},"
        f"ray.worker.default:{node(*worker, counts='min_workers:0,max_workers:2,')}}}"
    )


def test_aws_dry_run_checks_each_node_type_with_ec2_and_creates_nothing(
    moto: MotoServer, tmp_path: Path
) -> None:
    res = _aws_dry_run(moto, tmp_path, _node_types((MOTO_AMI, "m5.large"), (MOTO_AMI, "m5.large")))
    assert res.returncode == 0, res.output
    out = res.output
    assert "credentials: arn:aws:sts::" in out
    for node in ("ray.head.default", "ray.worker.default"):
        assert f"{node}: may launch m5.large from {MOTO_AMI} in us-west-2 (EC2 DryRun)" in out
    ec2 = _ec2(moto)
    assert ec2.describe_instances()["Reservations"] == []
    assert ec2.describe_key_pairs()["KeyPairs"] == []
    groups = ec2.describe_security_groups()["SecurityGroups"]
    assert [g["GroupName"] for g in groups if g["GroupName"] != "default"] == []
    _nothing_written(tmp_path / "sweep")


def test_aws_dry_run_refuses_an_image_and_an_instance_type_ec2_does_not_have(
    moto: MotoServer, tmp_path: Path
) -> None:
    key = "hydra.launcher.ray.cluster.available_node_types"
    res = _aws_dry_run(
        moto,
        tmp_path,
        _node_types(("ami-00000000000000000", "m5.large"), (MOTO_AMI, "x9.bogus")),
    )
    assert res.returncode != 0, res.output
    assert "Dry run: 2 problems" in res.output, res.output
    assert f"{key}.ray.head.default.node_config: ImageId ami-00000000000000000" in res.output
    assert f"{key}.ray.worker.default.node_config: InstanceType x9.bogus is not offered" in (
        res.output
    )
    assert _ec2(moto).describe_instances()["Reservations"] == []


def test_aws_dry_run_without_credentials_says_so_before_any_call(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    res = run_app(
        "app.py",
        "x=1",
        "hydra/launcher=ray_aws",
        DRY,
        cwd=tmp_path,
        env={"HOME": str(home), "AWS_EC2_METADATA_DISABLED": "true"},
        unset=tuple(
            k for k in os.environ if k.startswith("AWS_") and k != "AWS_EC2_METADATA_DISABLED"
        ),
        timeout=120,
    )
    assert res.returncode != 0
    assert "no AWS credentials found on this machine" in res.output


@pytest.mark.parametrize(
    ("code", "says"),
    [
        ("DryRunOperation", None),
        ("UnauthorizedOperation", "these credentials may not launch m5.large"),
        ("InvalidAMIID.Malformed", "ImageId ami-x: bad"),
        ("InsufficientInstanceCapacity", "EC2 would refuse m5.large from ami-x"),
    ],
)
def test_ec2_answers_to_a_dry_run_become_problems_that_say_what_to_do(
    code: str, says: str | None
) -> None:
    problem = ec2_dry_run_refusal({"Code": code, "Message": "bad"}, "m5.large", "ami-x")
    if says is None:
        assert problem is None
    else:
        assert problem is not None and says in problem


def test_a_job_whose_override_does_not_resolve_fails_alone_in_a_real_run(
    tmp_path: Path, ray_session: str
) -> None:
    # (The sweep's own bookkeeping once resolved the overrides and crashed the sweep.)
    sweep = tmp_path / "sweep"
    res = run_app(
        "app.py",
        "x=1,${nope}",
        f"hydra.launcher.ray.init.address={ray_session}",
        f"hydra.sweep.dir={sweep}",
        cwd=tmp_path,
    )
    assert res.returncode != 0
    assert (sweep / "0" / "done_0.json").is_file(), res.output
    assert "Interpolation key 'nope' not found" in res.output
    assert "1 succeeded, 1 failed" in res.output, res.output
