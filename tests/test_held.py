"""A finished job's JobReturn as the launching process holds it: read like
Hydra's, configs unpickled only when read, and a fraction of the memory."""

import copy
import gc
import tracemalloc
from typing import Any

import cloudpickle
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from hydra_ray.core.held import HeldJobReturn, hold, output_dir
from hydra_ray.core.redact import HIDDEN


def _job_return(n: int) -> JobReturn:
    """A JobReturn shaped like run_job's: the task's config and a Hydra config
    with a launcher section, a secret in it, and a help text of Hydra's size."""
    hydra_cfg = OmegaConf.create(
        {
            "hydra": {
                "runtime": {"output_dir": f"/sweep/{n}", "cwd": "/work"},
                "job": {"num": n, "id": str(n), "name": "app", "override_dirname": f"n={n}"},
                "launcher": {"ray": {"init": {"num_cpus": 2, "_redis_password": "pw"}}},
                "overrides": {"task": [f"n={n}"], "hydra": []},
                "help": {f"line{i}": "some help text " * 4 for i in range(60)},
                "job_logging": {f"handler{i}": {"level": "INFO", "x": i} for i in range(60)},
            }
        }
    )
    cfg = OmegaConf.create({"n": n, "model": {f"layer{i}": {"width": i} for i in range(30)}})
    return JobReturn(
        overrides=[f"n={n}"],
        cfg=cfg,
        hydra_cfg=hydra_cfg,
        working_dir="/work",
        task_name="app",
        status=JobStatus.COMPLETED,
        _return_value=n * 2,
    )


def test_a_held_job_return_reads_like_the_one_run_job_gave() -> None:
    held = hold(_job_return(3))
    assert isinstance(held, JobReturn)
    assert held.pickled("cfg") and held.pickled("hydra_cfg")
    assert (held.overrides, held.return_value, held.working_dir) == (["n=3"], 6, "/work")
    assert held.status == JobStatus.COMPLETED and held.task_name == "app"
    # Where the job wrote, without unpickling its Hydra config.
    assert output_dir(held) == "/sweep/3" and held.pickled("hydra_cfg")
    assert held.cfg.n == 3 and held.cfg.model.layer7.width == 7
    assert not held.pickled("cfg") and held.cfg is held.cfg  # unpickled once, then kept
    assert held.hydra_cfg.hydra.job.num == 3
    # As the job's record has it: the launcher's secrets hidden.
    assert held.hydra_cfg.hydra.launcher.ray.init._redis_password == HIDDEN
    assert held.hydra_cfg.hydra.launcher.ray.init.num_cpus == 2


def test_a_held_job_return_travels_still_pickled_and_its_copies_are_independent() -> None:
    held = cloudpickle.loads(cloudpickle.dumps(hold(_job_return(1))))
    assert isinstance(held, HeldJobReturn) and held.pickled("cfg") and held.pickled("hydra_cfg")
    assert held.cfg.n == 1 and held.return_value == 2

    moved = copy.copy(held)
    moved.hydra_cfg = OmegaConf.create({"hydra": {"runtime": {"output_dir": "/home/1"}}})
    assert output_dir(moved) == "/home/1"
    assert output_dir(held) == "/sweep/1" and held.pickled("hydra_cfg")
    # Read, then pickled again: what it holds now, not what it was held with.
    again = cloudpickle.loads(cloudpickle.dumps(moved))
    assert again.hydra_cfg.hydra.runtime.output_dir == "/home/1" and again.cfg.n == 1


def _bytes_held(make: Any, n: int) -> int:
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [make(i) for i in range(n)]
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert len(kept) == n
    return after - before


def test_held_job_returns_take_a_fraction_of_the_memory_of_unpickled_ones() -> None:
    """What a 10,000-job sweep's launching process keeps for each finished job:
    Hydra's sweepers hold every JobReturn until the sweep ends."""
    blobs = [cloudpickle.dumps(hold(_job_return(i))) for i in range(50)]
    plain = [cloudpickle.dumps(_job_return(i)) for i in range(50)]
    held_bytes = _bytes_held(lambda i: cloudpickle.loads(blobs[i]), 50)
    plain_bytes = _bytes_held(lambda i: cloudpickle.loads(plain[i]), 50)
    assert held_bytes * 4 < plain_bytes, (held_bytes, plain_bytes)


def test_a_held_job_return_keeps_every_attribute_of_hydras() -> None:
    """Hydra 1.4's JobReturn has more than 1.3's (a failed job's traceback):
    holding keeps them all."""
    ret = _job_return(2)
    ret.status = JobStatus.FAILED
    ret._return_value = ValueError("bad")
    ret.__dict__["_remote_traceback"] = [("app.py", "main", 3)]
    held = hold(ret)
    assert held.__dict__["_remote_traceback"] == [("app.py", "main", 3)]
    assert isinstance(held._return_value, ValueError) and held.status == JobStatus.FAILED
