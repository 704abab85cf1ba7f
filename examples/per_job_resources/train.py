"""Each job asks Ray for what its own model needs: `hydra.launcher.ray.remote`
in config.yaml interpolates into the job's `model` config. Sweep it with

    python train.py --multirun model=small,large seed=1,2

(with no GPU on this machine, try it on a local Ray that declares two:
hydra.launcher.ray.init.num_gpus=2, or see the plan with hydra.launcher.dry_run=true)."""

import logging
import os
import time

import hydra
import ray
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path=".", config_name="config")
def train(cfg: DictConfig) -> float:
    given = ray.get_runtime_context().get_assigned_resources()
    devices = os.environ.get("CUDA_VISIBLE_DEVICES", "")
    log.info(f"{cfg.model.name} (seed {cfg.seed}) got {given}, CUDA_VISIBLE_DEVICES={devices!r}")
    time.sleep(1)
    return float(cfg.seed) / cfg.model.width


if __name__ == "__main__":
    train()
