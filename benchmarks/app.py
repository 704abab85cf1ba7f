"""The app every launcher runs in the benchmark: sleeps `seconds`, returns `i`."""

import time

import hydra
from omegaconf import DictConfig


@hydra.main(version_base=None, config_path=".", config_name="app")
def main(cfg: DictConfig) -> int:
    if cfg.seconds:
        time.sleep(cfg.seconds)
    return int(cfg.i)


if __name__ == "__main__":
    main()
