"""A test app: each job records when it ran, sleeps, and then succeeds, raises,
or kills its own process, as its `mode` says."""

import json
import os
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg: DictConfig) -> int:
    num = HydraConfig.get().job.num
    out = Path(cfg.out) if cfg.out else Path(HydraConfig.get().runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    (out / f"started_{num}").write_text(str(os.getpid()))
    time.sleep(cfg.seconds)
    if cfg.mode == "raise":
        raise ValueError(f"job {num} was told to raise")
    if cfg.mode == "die":
        os._exit(3)
    record = {"num": num, "x": cfg.x, "start": started, "end": time.time(), "pid": os.getpid()}
    (out / f"done_{num}.json").write_text(json.dumps(record))
    return int(cfg.x) * 10


if __name__ == "__main__":
    main()
