"""A sweep through a cluster's dashboard alone: each job imports `model.py`
(sent with the Ray job by sync_up), writes a checkpoint in its job dir, and
returns its loss, which the sweeper receives as with any launcher."""

import logging
from pathlib import Path

import hydra
from model import loss_after
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base="1.3", config_path=".", config_name="config")
def train(cfg: DictConfig) -> float:
    loss = loss_after(cfg.epochs, cfg.lr)
    Path("checkpoint.txt").write_text(f"lr={cfg.lr} loss={loss}\n")
    log.info(f"lr={cfg.lr}: loss {loss:.4f} after {cfg.epochs} epochs")
    return loss


if __name__ == "__main__":
    train()
