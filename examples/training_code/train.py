"""Training code as it is, swept on Ray: a model class and a data helper
defined in this script, a process pool that prepares the data (the spawn start
method, as a PyTorch DataLoader with workers uses it under CUDA), a checkpoint
pickled with the model's class, and with `ranks=2` a second rank started by
running this script's command line again, the way PyTorch Lightning's DDP
starts its ranks under Hydra.

    python train.py --multirun lr=0.1,0.01
    python train.py --multirun lr=0.1,0.01 ranks=2
"""

import logging
import multiprocessing
import os
import pickle
import subprocess
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path
from omegaconf import DictConfig

log = logging.getLogger(__name__)


class Model:
    """A linear model y = w * x, fitted by gradient descent."""

    def __init__(self) -> None:
        self.w = 0.0

    def step(self, batch: list[tuple[float, float]], lr: float) -> float:
        grad = sum(2 * (self.w * x - y) * x for x, y in batch) / len(batch)
        self.w -= lr * grad
        return sum((self.w * x - y) ** 2 for x, y in batch) / len(batch)


def make_example(i: int) -> tuple[float, float]:
    x = (i % 10) / 10
    return x, 3.0 * x


def start_other_ranks(ranks: int) -> list["subprocess.Popen[bytes]"]:
    """Run this script again for ranks 1.. as Lightning does: its own command
    line, in this job's output dir, from the original working dir."""
    import __main__

    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += sys.argv[1:]
    command += [f"hydra.run.dir={HydraConfig.get().runtime.output_dir}", "hydra.output_subdir=null"]
    return [
        subprocess.Popen(
            [*command, f"hydra.job.name=rank_{rank}"],
            env={**os.environ, "LOCAL_RANK": str(rank)},
            cwd=get_original_cwd(),
        )
        for rank in range(1, ranks)
    ]


@hydra.main(version_base=None, config_path=".", config_name="config")
def train(cfg: DictConfig) -> float:
    rank = int(os.environ.get("LOCAL_RANK", "0"))
    others = start_other_ranks(cfg.ranks) if rank == 0 else []
    with multiprocessing.get_context("spawn").Pool(cfg.data_workers) as pool:
        data = pool.map(make_example, range(cfg.examples))
    model = Model()
    for epoch in range(cfg.epochs):
        loss = model.step(data, cfg.lr)
        log.info(f"rank {rank} epoch {epoch}: loss {loss:.4f}")
    out = Path(HydraConfig.get().runtime.output_dir)
    (out / f"model_rank{rank}.pkl").write_bytes(pickle.dumps(model))
    for other in others:
        if other.wait() != 0:
            raise RuntimeError(f"a rank ended with exit code {other.returncode}")
    return loss


if __name__ == "__main__":
    train()
