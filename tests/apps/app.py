"""A test app: each job records when and where it ran, sleeps, and then
succeeds (returning x * 10, or what the config says), raises, or kills its own
process, as the config says for its `x`."""

import importlib
import json
import os
import time
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg: DictConfig) -> Any:
    num = HydraConfig.get().job.num
    out = Path(cfg.out) if cfg.out else Path(HydraConfig.get().runtime.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    (out / f"started_{num}").write_text(str(os.getpid()))
    # One line per run of this job: counts its runs (retries, resumed sweeps).
    with (out / f"runs_{num}").open("a") as runs:
        runs.write(f"{os.getpid()}\n")
    run_number = len((out / f"runs_{num}").read_text().splitlines())
    slow = cfg.x in cfg.slow_first and run_number == 1
    time.sleep(cfg.slow_seconds if slow else cfg.seconds)
    if cfg.x in cfg.raise_on:
        raise ValueError(f"job {num} was told to raise")
    if cfg.x in cfg.fail_first and run_number == 1:
        raise RuntimeError(f"job {num} fails its first run")
    if cfg.x in cfg.die_on or (cfg.x in cfg.die_first and run_number == 1):
        os._exit(3)
    record = {
        "num": num,
        "x": cfg.x,
        "start": started,
        "end": time.time(),
        "pid": os.getpid(),
        "sid": os.getsid(0),
    }
    (out / f"done_{num}.json").write_text(json.dumps(record))
    if cfg.result_module:
        return importlib.import_module(cfg.result_module).Result(cfg.x)
    if num < len(cfg.returns):
        returns = cfg.returns[num]
        return OmegaConf.to_container(returns) if OmegaConf.is_config(returns) else returns
    return int(cfg.x) * 10


if __name__ == "__main__":
    main()
