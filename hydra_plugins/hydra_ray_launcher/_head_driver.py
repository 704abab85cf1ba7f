"""The driver that runs on a cluster's head: connects to the cluster's Ray, runs
the sweep with the same engine as the local launcher, gathers every job's
outputs from the node that wrote them onto the head, and writes the job returns.

    python -m hydra_plugins.hydra_ray_launcher._head_driver JOB_SPEC RETURNS
"""

import dataclasses
import io
import logging
import os
import shutil
import sys
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cloudpickle
from omegaconf import DictConfig

from ._engine import Job, Policy
from ._jobs import JobOutcome, SweepState
from ._records import write_record
from ._report import SweepProgress
from ._validate import ray_init_kwargs

log = logging.getLogger(__name__)

# Where, in the head driver's working dir, the launcher puts this plugin's source.
PLUGIN_DIR = "plugin"


@dataclass(frozen=True)
class JobSpec:
    """What the launching machine sends to the head: serialised as job_spec.pkl."""

    state: SweepState
    jobs: Sequence[Job]
    init: dict[str, Any]
    remote: dict[str, Any]
    # The sweep output dir as the jobs will resolve it (relative to the head's cwd).
    sweep_dir: str
    # Every job's config, composed on the launching machine: the app's config
    # files are not on the cluster.
    configs: Mapping[int, DictConfig]
    # Dir synced up with the user's code, relative to the head driver's working
    # dir or absolute: on every node's sys.path for the jobs.
    code_dir: str | None
    policy: Policy
    # Draw the live display (the user's terminal is one), this wide.
    live: bool
    width: int | None
    # Jobs of the batch taken from an earlier run (resume): for the progress counts.
    already_done: int


def main(spec_path: str, returns_path: str) -> None:
    import ray

    from . import _engine

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][HYDRA] %(message)s")
    with open(spec_path, "rb") as f:
        spec: JobSpec = cloudpickle.load(f)
    if not spec.live:  # the user's output is no terminal: no colour codes in it
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")
    # Jobs resolve relative dirs against the head's working dir, not the
    # launching machine's (which need not exist here).
    state = dataclasses.replace(spec.state, cwd=os.getcwd())
    runtime_env = dict(spec.init.get("runtime_env") or {})
    # Ray ships these to every node: the jobs there import this very plugin.
    runtime_env.setdefault("py_modules", []).append(os.path.abspath(f"{PLUGIN_DIR}/hydra_plugins"))
    if spec.code_dir is not None:
        # Ray ships the working_dir to every node and puts it on the jobs' sys.path.
        runtime_env.setdefault("working_dir", os.path.abspath(spec.code_dir))
    init = ray_init_kwargs(
        {**spec.init, "address": spec.init.get("address") or "auto", "runtime_env": runtime_env}
    )
    log.info(f"Connecting to the cluster's Ray with config: {init}")
    ray.init(**init)
    shipped = _engine.ship_state(state)
    sweep_dir = Path(spec.sweep_dir).resolve()
    with SweepProgress(
        [(j.idx, j.overrides) for j in spec.jobs],
        live=spec.live and _have_rich(),
        width=spec.width,
        already_done=spec.already_done,
    ) as progress:
        outcomes = _engine.run_jobs(
            shipped,
            spec.jobs,
            spec.remote,
            policy=spec.policy,
            progress=progress,
            configs=spec.configs,
            # On the head: synced down with the outputs, also after an interruption.
            on_finished=lambda outcome: write_record(sweep_dir, outcome),
        )
    gather_outputs(sweep_dir)
    tmp = returns_path + ".part"
    with open(tmp, "wb") as f:
        cloudpickle.dump(outcomes, f)
    os.replace(tmp, returns_path)


def _have_rich() -> bool:
    try:
        import rich  # noqa: F401
    except ImportError:
        log.warning("rich is not installed on the head: progress shown as lines")
        return False
    return True


def gather_outputs(sweep_dir: Path) -> None:
    """Bring the outputs jobs wrote on other nodes into the head's sweep dir, and
    remove them there: the sweep dir on the head then holds every job's outputs."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    nodes = ray.nodes()  # type: ignore[no-untyped-call]
    others = [n["NodeID"] for n in nodes if n["Alive"] and n["NodeID"] != here]
    pack = ray.remote(num_cpus=0)(_pack_and_remove)
    packs = [
        pack.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            str(sweep_dir), os.getcwd()
        )
        for node in others
    ]
    for node, data in zip(others, ray.get(packs), strict=True):
        if data:
            with tarfile.open(fileobj=io.BytesIO(data)) as tar:
                tar.extractall(sweep_dir)
            log.info(f"Gathered the outputs written on node {node[:8]} into {sweep_dir}")


def _pack_and_remove(sweep_dir: str, workdir: str) -> bytes:
    """On another node: its part of the sweep dir as a tar archive; then the
    sweep dir and the working dir the jobs made there are removed."""
    data = b""
    if os.path.isdir(sweep_dir):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            tar.add(sweep_dir, arcname=".")
        data = buf.getvalue()
    shutil.rmtree(sweep_dir, ignore_errors=True)
    shutil.rmtree(workdir, ignore_errors=True)
    return data


def load_outcomes(path: str) -> list[JobOutcome]:
    with open(path, "rb") as f:
        outcomes = cloudpickle.load(f)
    assert isinstance(outcomes, list)
    return outcomes


if __name__ == "__main__":
    main(*sys.argv[1:3])
