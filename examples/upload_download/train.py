"""Trains a (toy) model per random seed and saves a checkpoint in the job's
output dir; `model` is a second module of this app, synced up with it."""

import logging
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from model.my_model import MyModel
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path=".", config_name="config")
def main(cfg: DictConfig) -> None:
    log.info("Start training...")
    model = MyModel(cfg.random_seed)
    # Each job has its own output dir: the checkpoint goes there.
    checkpoint_dir = Path(HydraConfig.get().runtime.output_dir) / cfg.checkpoint_path
    checkpoint_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"Created dir for checkpoints. dir={cfg.checkpoint_path}")
    model.save(checkpoint_dir / f"checkpoint_{cfg.random_seed}.pt")


if __name__ == "__main__":
    main()
