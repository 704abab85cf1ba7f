"""A training job that survives being stopped: it checkpoints every epoch in
its job dir and, when it runs again there (a retry of the launcher, or a
resumed sweep), continues from its last checkpoint.

    python train.py --multirun                      # 4 jobs: each crashes once, retried
    python train.py --multirun crash_once_at_epoch=null hydra.sweep.dir=multirun/a
    # Ctrl-C half way, then run what did not finish:
    python train.py --multirun crash_once_at_epoch=null hydra.sweep.dir=multirun/a \
        hydra.launcher.resume=true
"""

import json
import logging
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

log = logging.getLogger(__name__)


@hydra.main(version_base=None, config_path=".", config_name="config")
def train(cfg: DictConfig) -> float:
    checkpoint = Path(HydraConfig.get().runtime.output_dir) / "checkpoint.json"
    state = {"epoch": 0, "loss": 1.0}
    if checkpoint.exists():
        state = json.loads(checkpoint.read_text())
        log.info(f"Continuing from the checkpoint of epoch {state['epoch']}")
    first_epoch = state["epoch"]
    for epoch in range(first_epoch + 1, cfg.epochs + 1):
        if epoch == cfg.crash_once_at_epoch and first_epoch == 0:
            raise RuntimeError(f"simulated preemption at epoch {epoch}")
        time.sleep(cfg.seconds_per_epoch)
        state = {"epoch": epoch, "loss": state["loss"] * (1 - cfg.lr)}
        # Write then rename: a job stopped mid-write keeps its previous checkpoint.
        checkpoint.with_suffix(".tmp").write_text(json.dumps(state))
        checkpoint.with_suffix(".tmp").replace(checkpoint)
        log.info(f"epoch {epoch}: loss {state['loss']:.4f}")
    return float(state["loss"])


if __name__ == "__main__":
    train()
