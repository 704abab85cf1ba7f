"""A test app shaped like training code: a model class and helpers in the
script itself, resolvers and a structured config registered at module level
(as many project templates do, without replace=True), a checkpoint of the
model, a multiprocessing pool over a helper (fork and spawn), a process pool,
and a relaunch of sys.argv in PyTorch Lightning's DDP form (an extra "rank"
that runs the same job's config alone, in the job's own output dir).

Each job writes what it saw into `report.json` in its output dir; the rank it
starts writes `rank1.json` there. With `edit_script`, job x=1 rewrites this
file's MARK on disk (an app edited after its launch)."""

import json
import multiprocessing
import os
import pickle
import subprocess
import sys
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path
from omegaconf import DictConfig, OmegaConf

# Once per process that runs this module's code: the jobs report it.
LOADED_AS = uuid.uuid4().hex
MARK = "as launched"

OmegaConf.register_new_resolver("eval", eval)
OmegaConf.register_new_resolver("double", lambda x: 2 * int(x))


@dataclass
class OptimConf:
    name: str = "sgd"
    lr: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.99])


ConfigStore.instance().store(group="optim", name="sgd", node=OptimConf)


class Model:
    """A stand-in for a network: weights that a checkpoint must keep."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.weights = [square(i) for i in range(width)]

    def forward(self, x: int) -> int:
        return sum(w * x for w in self.weights)


def square(x: int) -> int:
    return x * x


def in_pool(method: str) -> list[int]:
    with multiprocessing.get_context(method).Pool(2) as pool:
        return pool.map(square, [1, 2, 3])


def in_executor(xs: list[int]) -> list[int]:
    with ProcessPoolExecutor(2) as executor:
        return list(executor.map(square, xs))


def relaunch_as_lightning_does() -> None:
    """What Lightning's _hydra_subprocess_cmd builds for local rank 1, run."""
    import __main__

    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += sys.argv[1:]
    run_dir = HydraConfig.get().runtime.output_dir
    command += [f'hydra.run.dir="{run_dir}"', "hydra.job.name=train_ddp_process_1"]
    command += ["hydra.output_subdir=null"]
    env = {**os.environ, "LOCAL_RANK": "1"}
    subprocess.run(command, cwd=get_original_cwd(), env=env, check=True, timeout=120)


def attempt(what: Any) -> Any:
    try:
        return what()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"


@hydra.main(version_base=None, config_path=".", config_name="trainer")
def main(cfg: DictConfig) -> Any:
    out = Path(HydraConfig.get().runtime.output_dir)
    seen = {"x": cfg.x, "argv": sys.argv, "pid": os.getpid(), "loaded_as": LOADED_AS}
    seen["original_cwd"] = get_original_cwd()
    if os.environ.get("LOCAL_RANK") == "1":
        (out / "rank1.json").write_text(json.dumps(seen))
        return None
    model = Model(cfg.width)
    seen["checkpoint"] = attempt(
        lambda: pickle.loads(pickle.dumps(model)).forward(cfg.x) == model.forward(cfg.x)
    )
    (out / "model.pkl").write_bytes(pickle.dumps(model))
    seen["fork"] = attempt(lambda: [in_pool("fork") for _ in range(cfg.fork_pools)][-1])
    seen["spawn"] = attempt(lambda: in_pool("spawn"))
    seen["executor"] = attempt(lambda: in_executor([4, 5]))
    seen["resolved"] = [cfg.doubled, cfg.evaluated, cfg.optim.lr]
    import __main__

    seen["main_file"] = getattr(__main__, "__file__", None)
    seen["main_name"] = __main__.__name__
    seen["main_spec"] = getattr(__main__.__spec__, "name", None)
    seen["classes"] = sorted(
        name
        for name, value in vars(__main__).items()
        if isinstance(value, type) and value.__module__ == "__main__"
    )
    seen["mark"] = MARK
    if cfg.edit_script and cfg.x == 1:
        script = Path(__main__.__file__)
        script.write_text(script.read_text().replace('"as launched"', '"as edited"'))
    if cfg.relaunch:
        seen["relaunch"] = attempt(relaunch_as_lightning_does)
    (out / "report.json").write_text(json.dumps(seen))
    return cfg.x


if __name__ == "__main__":
    main()
